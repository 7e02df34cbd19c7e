//! Webhooks, one kind of notice target (`server::notices`): the `[[webhooks]]` config, the
//! body a notice becomes (generic JSON, or a Slack-compatible `{"text": ...}` message) and its
//! delivery, retried on connect errors, timeouts, 429 and 5xx with capped, fully jittered
//! backoff, at most [`MAX_ATTEMPTS`] times. The queues and workers that keep deliveries off
//! the call path are `notices/targets.rs`.
//!
//! Webhook URLs are secrets (a Slack URL is its own credential), so logs and `Debug` name the
//! host only.

use std::fmt;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub(crate) use crate::server::notices::{GrantEvent, GrantNotice, Message, Notice, NoticeEvent};
use crate::util::Backoff;

/// Attempts per delivery, the first included.
pub(crate) const MAX_ATTEMPTS: u32 = 5;

#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum WebhookKind {
    /// `{"event": "approval.requested", ...}` (or `approval.reminder`, `approval.expired`)
    /// with every [`Notice`] field; for grants `grant.requested`, `break_glass.requested`,
    /// `break_glass.open` or `break_glass.call` with every [`GrantNotice`] field.
    #[default]
    Generic,
    /// `{"text": "..."}`, which Slack incoming webhooks (and Mattermost, Rocket.Chat...) accept.
    Slack,
}

impl WebhookKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookKind::Generic => "generic",
            WebhookKind::Slack => "slack",
        }
    }
}

/// One configured hook. `kind` defaults to `generic`.
#[derive(schemars::JsonSchema, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// The name escalation groups use for it (`[[notices.escalation]]`). Default:
    /// `webhooks[i]`.
    #[serde(default)]
    pub name: Option<String>,
    /// Where the notice is POSTed, e.g. `https://hooks.slack.com/services/…`. It may carry a
    /// secret (a Slack hook's path): it is never logged, only its host.
    pub url: String,
    /// The body's shape: `generic` (the notice as JSON) or `slack` (an incoming-webhook text).
    #[serde(default)]
    pub kind: WebhookKind,
}

impl fmt::Debug for WebhookConfig {
    /// The URL is a secret: only its host is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = Url::parse(&self.url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_else(|| "?".into());
        f.debug_struct("WebhookConfig")
            .field("name", &self.name)
            .field("url", &format_args!("<secret, host {host}>"))
            .field("kind", &self.kind)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum WebhookError {
    #[error("`{field}`: {rule}")]
    Invalid { field: String, rule: String },
}

impl WebhookConfig {
    /// The URL, checked: absolute, http or https, with a host. `field` is how the config names
    /// this hook's url (`webhooks[0].url`). The error never repeats the URL.
    pub(crate) fn parse_url(&self, field: &str) -> Result<Url, WebhookError> {
        let invalid = |rule: String| WebhookError::Invalid {
            field: field.to_owned(),
            rule,
        };
        let url = Url::parse(&self.url).map_err(|e| invalid(format!("not a URL ({e})")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "scheme `{}` must be http or https",
                url.scheme()
            )));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(invalid("the URL has no host".into()));
        }
        Ok(url)
    }
}

/// Checks every hook's URL, naming each as `webhooks[i].url`.
pub(crate) fn validate(hooks: &[WebhookConfig]) -> Result<(), WebhookError> {
    for (i, hook) in hooks.iter().enumerate() {
        hook.parse_url(&format!("webhooks[{i}].url"))?;
    }
    Ok(())
}

/// The request body a hook of `kind` receives.
fn body(kind: WebhookKind, message: &Message) -> Value {
    match kind {
        WebhookKind::Generic => {
            let mut body = json!({"event": message.event()});
            let fields = match message {
                Message::Approval(n) => serde_json::to_value(n),
                Message::Grant(n) => serde_json::to_value(n),
            };
            if let (Value::Object(out), Ok(Value::Object(fields))) = (&mut body, fields) {
                out.extend(fields);
            }
            body
        }
        WebhookKind::Slack => json!({"text": match message {
            Message::Approval(n) => slack_text(n),
            Message::Grant(n) => grant_slack_text(n),
        }}),
    }
}

/// Escapes text as Slack requires (`& < >`).
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A reason on one line, at most 200 characters.
fn one_line(reason: &str) -> String {
    let mut reason: String = reason.split_whitespace().collect::<Vec<_>>().join(" ");
    if let Some((cut, _)) = reason.char_indices().nth(200) {
        reason.truncate(cut);
        reason.push('…');
    }
    reason
}

/// One line: what happened, tool, runners, requester, reason, risk, expiry and the link. Text
/// from the caller is escaped as Slack requires (`& < >`) and flattened to one line.
fn slack_text(n: &Notice) -> String {
    let reason = one_line(&n.reason);
    let runners = if n.runners.is_empty() {
        String::new()
    } else {
        format!(" on {}", escape(&n.runners.join(", ")))
    };
    let link = match &n.portal_url {
        Some(url) => format!("<{}|review {}>", escape(url), escape(&n.approval_id)),
        None => format!("approval {}", escape(&n.approval_id)),
    };
    let what = match n.event {
        NoticeEvent::Requested => "Approval requested".to_owned(),
        NoticeEvent::Reminder => "Reminder, approval still waiting".to_owned(),
        NoticeEvent::Expired => format!(
            "Approval expired unanswered after {} (nothing ran)",
            crate::server::notices::waited_text(n.waited_secs.unwrap_or_default())
        ),
    };
    format!(
        "{what}: `{}`{runners} by {} (risk {}): \"{}\" · expires {} · {link}",
        escape(&n.tool),
        escape(&n.requester),
        escape(&n.risk),
        escape(&reason),
        escape(&n.expires_at),
    )
}

/// One line about a grant or a window: what happened (a window's notices start with
/// `BREAK-GLASS`), who, which tools or tool, which runners, the reason, the expiry and the link
/// to the grant's page. Escaped and flattened as [`slack_text`].
fn grant_slack_text(n: &GrantNotice) -> String {
    let runners = escape(&n.runners.join(", "));
    let tools = escape(&n.tools.join(", "));
    let what = match n.event {
        GrantEvent::Requested => format!(
            "Grant requested: {} asks for `{tools}` on {runners} ({} must sign)",
            escape(&n.agent),
            n.required
        ),
        GrantEvent::BreakGlassRequested => format!(
            "BREAK-GLASS window requested by {}: {} would run any write on {runners} ({} must sign)",
            escape(&n.requested_by),
            escape(&n.agent),
            n.required
        ),
        GrantEvent::BreakGlassOpen => format!(
            "BREAK-GLASS window open: {} runs any write on {runners}, signed by {}",
            escape(&n.agent),
            escape(&n.signed_by.join(", "))
        ),
        GrantEvent::BreakGlassCall => format!(
            "BREAK-GLASS call: {} calls `{}` on {runners} in window {}",
            escape(&n.agent),
            escape(n.tool.as_deref().unwrap_or_default()),
            escape(&n.grant_id)
        ),
    };
    let name = if n.break_glass { "window" } else { "grant" };
    let link = match &n.portal_url {
        Some(url) => format!("<{}|review {name} {}>", escape(url), escape(&n.grant_id)),
        None => format!("{name} {}", escape(&n.grant_id)),
    };
    format!(
        "{what}: \"{}\" · expires {} · {link}",
        escape(&one_line(&n.reason)),
        escape(&n.expires_at),
    )
}

/// Delivery tuning (webhooks and email); the defaults are production's, tests shorten the
/// waits.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) backoff: Backoff,
    pub(crate) timeout: Duration,
    pub(crate) max_attempts: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            backoff: Backoff::try_new(Duration::from_millis(500), Duration::from_secs(30))
                .expect("valid bounds"),
            timeout: Duration::from_secs(5),
            max_attempts: MAX_ATTEMPTS,
        }
    }
}

/// A hook as the worker uses it.
pub(crate) struct Hook {
    url: Url,
    /// What logs and metrics call it: the URL's host, never the URL.
    pub(crate) host: String,
    kind: WebhookKind,
}

impl Hook {
    /// The hook of `config`, its URL checked (`field` names it: `webhooks[0].url`).
    pub(crate) fn new(config: &WebhookConfig, field: &str) -> Result<Hook, WebhookError> {
        let url = config.parse_url(field)?;
        Ok(Hook {
            host: url.host_str().unwrap_or_default().to_owned(),
            url,
            kind: config.kind,
        })
    }

    /// Posts `notice` in this hook's shape until it lands or gives up; the outcome's name.
    pub(crate) async fn send(
        &self,
        client: &reqwest::Client,
        notice: &Message,
        settings: &Settings,
    ) -> &'static str {
        let body = body(self.kind, notice);
        deliver(client, self, &body, settings, notice.id())
            .await
            .outcome
            .as_str()
    }
}

/// The HTTP client every hook shares: `timeout`, and no redirects (a redirect could carry the
/// notice to a host nobody configured).
pub(crate) fn client(timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Delivered,
    /// The hook answered with a status that retrying will not change (4xx other than 429).
    Refused(StatusCode),
    /// Every attempt failed, or failed in a way that is not retried.
    Failed,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Refused(_) => "refused",
            Outcome::Failed => "failed",
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Delivery {
    attempts: u32,
    outcome: Outcome,
}

/// Posts `body` until it lands, the hook refuses it, or the attempts run out.
async fn deliver(
    client: &reqwest::Client,
    hook: &Hook,
    body: &Value,
    settings: &Settings,
    id: &str,
) -> Delivery {
    let host = hook.host.as_str();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let done = |outcome| Delivery { attempts, outcome };
        match client.post(hook.url.clone()).json(body).send().await {
            Ok(resp) if resp.status().is_success() => {
                tracing::info!(host, id, attempts, "webhook delivered");
                return done(Outcome::Delivered);
            }
            Ok(resp)
                if resp.status() == StatusCode::TOO_MANY_REQUESTS
                    || resp.status().is_server_error() =>
            {
                tracing::warn!(host, id, attempts, status = %resp.status(), "webhook delivery failed");
            }
            Ok(resp) => {
                tracing::error!(host, id, attempts, status = %resp.status(), "webhook refused the notice; not retried");
                return done(Outcome::Refused(resp.status()));
            }
            // reqwest's errors print the URL; `without_url` keeps the secret out of the log.
            Err(e) if e.is_connect() || e.is_timeout() => {
                tracing::warn!(host, id, attempts, error = %e.without_url(), "webhook delivery failed");
            }
            Err(e) => {
                tracing::error!(host, id, attempts, error = %e.without_url(), "webhook delivery failed; not retried");
                return done(Outcome::Failed);
            }
        }
        if attempts >= settings.max_attempts {
            tracing::error!(host, id, attempts, "webhook delivery given up");
            return done(Outcome::Failed);
        }
        tokio::time::sleep(settings.backoff.delay(attempts - 1)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use axum::extract::State;
    use axum::routing::post;
    use axum::{Json, Router};

    use super::*;

    /// A hook server: answers each POST with the next scripted status (200 once the script
    /// runs out) and keeps every body.
    #[derive(Clone, Default)]
    struct Server {
        script: Arc<Mutex<VecDeque<u16>>>,
        bodies: Arc<Mutex<Vec<Value>>>,
    }

    impl Server {
        async fn start(script: &[u16]) -> (Server, String) {
            let server = Server::default();
            server.script.lock().unwrap().extend(script);
            let app = Router::new()
                .route("/hook", post(receive))
                .with_state(server.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!(
                "http://{}/hook?token=secret",
                listener.local_addr().unwrap()
            );
            tokio::spawn(async move { axum::serve(listener, app).await });
            (server, url)
        }

        fn bodies(&self) -> Vec<Value> {
            self.bodies.lock().unwrap().clone()
        }
    }

    async fn receive(State(s): State<Server>, Json(body): Json<Value>) -> StatusCode {
        s.bodies.lock().unwrap().push(body);
        let status = s.script.lock().unwrap().pop_front().unwrap_or(200);
        StatusCode::from_u16(status).unwrap()
    }

    fn fast() -> Settings {
        Settings {
            backoff: Backoff::try_new(Duration::from_millis(1), Duration::from_millis(5)).unwrap(),
            timeout: Duration::from_secs(2),
            max_attempts: MAX_ATTEMPTS,
        }
    }

    fn hook(url: &str, kind: WebhookKind) -> Hook {
        let url = Url::parse(url).unwrap();
        Hook {
            host: url.host_str().unwrap().to_owned(),
            url,
            kind,
        }
    }

    fn notice() -> Notice {
        crate::server::notices::tests::notice(NoticeEvent::Requested)
    }

    async fn send(status: &[u16], kind: WebhookKind) -> (Delivery, Vec<Value>) {
        let (server, url) = Server::start(status).await;
        let n = notice();
        let delivery = deliver(
            &reqwest::Client::new(),
            &hook(&url, kind),
            &body(kind, &n.clone().into()),
            &fast(),
            &n.approval_id,
        )
        .await;
        (delivery, server.bodies())
    }

    #[tokio::test]
    async fn retries_5xx_then_delivers_both_kinds() {
        let (d, bodies) = send(&[503, 503], WebhookKind::Generic).await;
        assert_eq!(
            d,
            Delivery {
                attempts: 3,
                outcome: Outcome::Delivered
            }
        );
        assert_eq!(bodies.len(), 3);
        let mut want = serde_json::to_value(notice()).unwrap();
        want["event"] = json!("approval.requested");
        want.as_object_mut().unwrap().remove("waited_secs");
        assert_eq!(bodies[2], want);
        assert_eq!(bodies[2]["runners"], json!(["hvn05", "hvn06"]));

        let (d, bodies) = send(&[503, 503], WebhookKind::Slack).await;
        assert_eq!((d.attempts, d.outcome), (3, Outcome::Delivered));
        let body = bodies[2].as_object().unwrap();
        assert_eq!(body.keys().collect::<Vec<_>>(), ["text"]);
        let text = body["text"].as_str().unwrap();
        assert_eq!(
            text,
            "Approval requested: `nomad.task_resources_set` on hvn05, hvn06 by agent:deploy-bot (risk high): \"traefik is OOM-killed &lt;again&gt; &amp; again\" · expires 2030-01-01T00:00:00.000000Z · <https://emisar.example/#/approvals/ap-1|review ap-1>"
        );
    }

    #[tokio::test]
    async fn what_is_retried_and_what_is_not() {
        let cases: &[(&[u16], u32, Outcome)] = &[
            (&[400], 1, Outcome::Refused(StatusCode::BAD_REQUEST)),
            (&[404], 1, Outcome::Refused(StatusCode::NOT_FOUND)),
            (&[429], 2, Outcome::Delivered),
            (&[500, 502, 504], 4, Outcome::Delivered),
            (&[503; 5], 5, Outcome::Failed),
        ];
        for (script, attempts, outcome) in cases {
            let (d, bodies) = send(script, WebhookKind::Generic).await;
            assert_eq!(d.attempts, *attempts, "{script:?}");
            assert_eq!(d.outcome, *outcome, "{script:?}");
            assert_eq!(bodies.len() as u32, *attempts, "{script:?}");
        }
    }

    #[tokio::test]
    async fn connect_errors_are_retried() {
        // A port that was just free: nothing listens there.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        drop(listener);
        let d = deliver(
            &reqwest::Client::new(),
            &hook(&url, WebhookKind::Generic),
            &json!({}),
            &fast(),
            "ap-1",
        )
        .await;
        assert_eq!(
            d,
            Delivery {
                attempts: MAX_ATTEMPTS,
                outcome: Outcome::Failed
            }
        );
    }

    #[test]
    fn config_is_checked_and_never_shows_the_url() {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Config {
            webhooks: Vec<WebhookConfig>,
        }
        let config: Config = toml::from_str(
            "[[webhooks]]\nurl = \"https://hooks.slack.com/services/T0/B0/SECRET\"\nkind = \"slack\"\n\n[[webhooks]]\nurl = \"http://10.0.0.1:8080/x\"\n",
        )
        .unwrap();
        assert_eq!(config.webhooks[0].kind, WebhookKind::Slack);
        assert_eq!(config.webhooks[1].kind, WebhookKind::Generic);
        validate(&config.webhooks).unwrap();
        let shown = format!("{config:?}", config = config.webhooks);
        assert!(
            !shown.contains("SECRET") && shown.contains("hooks.slack.com"),
            "{shown}"
        );

        for bad in [
            "url = \"https://x\"\nkind = \"Slack\"",
            "url = \"https://x\"\nsecret = \"y\"",
        ] {
            assert!(toml::from_str::<WebhookConfig>(bad).is_err(), "{bad}");
        }
        let cases = [
            (
                "ftp://files.example/SECRET",
                "scheme `ftp` must be http or https",
            ),
            ("hooks.slack.com/SECRET", "not a URL"),
            ("file:///etc/SECRET", "scheme `file`"),
        ];
        for (url, want) in cases {
            let hooks = [
                WebhookConfig {
                    name: None,
                    url: "https://ok.example/".into(),
                    kind: WebhookKind::Generic,
                },
                WebhookConfig {
                    name: None,
                    url: url.into(),
                    kind: WebhookKind::Generic,
                },
            ];
            let err = validate(&hooks).unwrap_err().to_string();
            assert!(err.starts_with("`webhooks[1].url`: "), "{err}");
            assert!(err.contains(want) && !err.contains("SECRET"), "{err}");
        }
    }

    #[test]
    fn a_windows_notices_say_break_glass_and_link_the_grants_page_only() {
        use crate::server::notices::grants::tests::notice as window;
        let mut call = window(GrantEvent::BreakGlassCall);
        call.tool = Some("linux.systemctl_restart".into());
        call.call_id = Some("c-1".into());
        call.runners = vec!["edge-1".into()];
        call.agent = "agent:test-agent".into();
        let text = grant_slack_text(&call);
        assert_eq!(
            text,
            "BREAK-GLASS call: agent:test-agent calls `linux.systemctl_restart` on edge-1 in window g-1: \"INC-42: the edge is &lt;down&gt; &amp; out\" · expires 2030-01-01T00:00:00Z · <https://emisar.example/#/grants/g-1|review window g-1>"
        );
        let generic = body(WebhookKind::Generic, &Message::Grant(call));
        assert_eq!(generic["event"], "break_glass.call");
        assert_eq!(generic["tool"], "linux.systemctl_restart");
        assert_eq!(generic["call_id"], "c-1");
        assert_eq!(generic["runners"], json!(["edge-1"]));
        assert_eq!(generic["portal_url"], "https://emisar.example/#/grants/g-1");
        assert!(generic.get("signed_by").is_none(), "{generic}");

        let mut open = window(GrantEvent::BreakGlassOpen);
        open.signed_by = vec!["bob".into(), "carol".into()];
        assert!(
            grant_slack_text(&open).starts_with(
                "BREAK-GLASS window open: agent:ops-bot runs any write on edge-1, edge-2, signed by bob, carol: "
            ),
            "{}",
            grant_slack_text(&open)
        );
        assert!(
            grant_slack_text(&window(GrantEvent::BreakGlassRequested))
                .starts_with("BREAK-GLASS window requested by alice: agent:ops-bot would run any write on edge-1, edge-2 (2 must sign): ")
        );
        let mut grant = window(GrantEvent::Requested);
        grant.tools = vec!["linux.systemctl_restart".into()];
        let text = grant_slack_text(&grant);
        assert!(
            text.starts_with("Grant requested: agent:ops-bot asks for `linux.systemctl_restart` on edge-1, edge-2 (2 must sign): ")
                && text.ends_with("<https://emisar.example/#/grants/g-1|review grant g-1>")
                && !text.contains("BREAK-GLASS"),
            "{text}"
        );
        for event in [
            GrantEvent::Requested,
            GrantEvent::BreakGlassRequested,
            GrantEvent::BreakGlassOpen,
            GrantEvent::BreakGlassCall,
        ] {
            let text = grant_slack_text(&window(event)).to_lowercase();
            assert!(
                !text.contains("/approve") && !text.contains("/deny") && !text.contains("/revoke"),
                "{text}"
            );
        }
    }

    #[test]
    fn slack_text_is_one_line_and_capped() {
        let mut n = notice();
        n.reason = "x".repeat(500);
        n.runners.clear();
        n.portal_url = None;
        let text = slack_text(&n);
        assert!(!text.contains('\n'));
        assert!(
            text.contains(&format!("\"{}…\"", "x".repeat(200))),
            "{text}"
        );
        assert!(text.ends_with("· approval ap-1"), "{text}");
        assert!(
            text.starts_with("Approval requested: `nomad.task_resources_set` by "),
            "{text}"
        );
    }
}
