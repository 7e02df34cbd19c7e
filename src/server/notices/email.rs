//! Email notices over SMTP (lettre on rustls): the `[[notices.email]]` config, its checks,
//! the message a notice becomes, and its delivery with retries on transient failures.
//!
//! The password comes from a file or an environment variable, never the config itself, and
//! is never logged: logs name the SMTP host only.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use lettre::message::header::ContentType;
use lettre::message::{Mailbox, Mailboxes};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use serde::Deserialize;

use super::{GrantEvent, GrantNotice, Message, Notice, NoticeEvent};
use crate::server::notices::webhook::Settings;

/// How the connection to the SMTP server is protected.
#[derive(
    schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTls {
    /// Plain connection upgraded with STARTTLS, which is required (port 587 by default).
    #[default]
    Starttls,
    /// TLS from the first byte, "implicit TLS" (port 465 by default).
    Tls,
    /// No TLS at all: only for an SMTP server on loopback (port 25 by default).
    None,
}

/// One `[[notices.email]]` target.
#[derive(schemars::JsonSchema, Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailConfig {
    /// The name escalation groups use for it. Default: `notices.email[i]`.
    #[serde(default)]
    pub name: Option<String>,
    /// The SMTP server's host name (checked against its certificate), e.g. `smtp.example.com`.
    pub host: String,
    /// Its port, e.g. `port = 2525`. Default: 587 for `starttls`, 465 for `tls`, 25 for `none`.
    #[serde(default)]
    pub port: Option<u16>,
    /// `starttls` (default), `tls`, or `none` (only when `host` is loopback).
    #[serde(default)]
    pub tls: SmtpTls,
    /// The sender, e.g. `emisar <emisar@example.com>`.
    pub from: String,
    /// The recipients (at least one), e.g. `to = ["oncall@example.com"]`.
    pub to: Vec<String>,
    /// The SMTP user, when the server wants a login (with `password_file` or `password_env`).
    #[serde(default)]
    pub user: Option<String>,
    /// A file holding the SMTP password (surrounding whitespace is ignored), e.g.
    /// `/etc/emisar/smtp-password`.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// An environment variable holding the SMTP password.
    #[serde(default)]
    pub password_env: Option<String>,
}

impl EmailConfig {
    /// The port to connect to: the configured one, or the usual one for `tls`.
    fn port(&self) -> u16 {
        self.port.unwrap_or(match self.tls {
            SmtpTls::Starttls => 587,
            SmtpTls::Tls => 465,
            SmtpTls::None => 25,
        })
    }

    /// Checks what serde cannot; `field` is how the config names this target
    /// (`notices.email[0]`), and each error names the field and the rule.
    pub(crate) fn check(&self, field: &str) -> Result<(), String> {
        if self.host.is_empty() || self.host.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(format!("{field}.host: must be a host name or address"));
        }
        if self.port == Some(0) {
            return Err(format!("{field}.port: must be between 1 and 65535"));
        }
        if self.tls == SmtpTls::None && !is_loopback(&self.host) {
            return Err(format!(
                "{field}.tls: `none` is allowed only for a loopback host (localhost, 127.0.0.1, ::1), not `{}`: the password and the notices would travel in clear",
                self.host
            ));
        }
        self.from
            .parse::<Mailbox>()
            .map_err(|_| format!("{field}.from: not an email address"))?;
        if self.to.is_empty() {
            return Err(format!("{field}.to: must list at least one address"));
        }
        for (i, to) in self.to.iter().enumerate() {
            to.parse::<Mailbox>()
                .map_err(|_| format!("{field}.to[{i}]: not an email address"))?;
        }
        self.check_login(field)
    }

    fn check_login(&self, field: &str) -> Result<(), String> {
        let password = self.password_file.is_some() || self.password_env.is_some();
        if self.password_file.is_some() && self.password_env.is_some() {
            return Err(format!(
                "{field}.password_file and {field}.password_env: set at most one"
            ));
        }
        match &self.user {
            Some(user) if user.is_empty() || user.chars().any(char::is_control) => Err(format!(
                "{field}.user: must be non-empty without control characters"
            )),
            Some(_) if !password => Err(format!(
                "{field}.user: set {field}.password_file or {field}.password_env with it"
            )),
            None if password => Err(format!(
                "{field}.user: must be set when a password is (password_file or password_env)"
            )),
            _ => match &self.password_env {
                Some(var) if var.is_empty() || var.contains('=') || var.contains('\0') => Err(
                    format!("{field}.password_env: `{var}` is not an environment variable name"),
                ),
                _ => Ok(()),
            },
        }
    }

    /// Reads the password from its file or environment variable. The error names where it
    /// looked, never the value.
    fn password(&self, field: &str) -> anyhow::Result<Option<String>> {
        let value = if let Some(path) = &self.password_file {
            std::fs::read_to_string(path)
                .with_context(|| format!("{field}.password_file: cannot read {}", path.display()))?
        } else if let Some(var) = &self.password_env {
            std::env::var(var)
                .with_context(|| format!("{field}.password_env: ${var} is not set"))?
        } else {
            return Ok(None);
        };
        let value = value.trim().to_owned();
        if value.is_empty() {
            anyhow::bail!("{field}: the SMTP password is empty");
        }
        Ok(Some(value))
    }
}

/// Whether `host` names this machine: `localhost` or a loopback address.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An email target ready to send: its transport (with the password), sender and recipients.
pub(crate) struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    to: Mailboxes,
    /// What logs and metrics call it: the SMTP host.
    pub(crate) host: String,
}

impl Mailer {
    /// The mailer of a checked config; `field` names it in errors (`notices.email[0]`).
    pub(crate) fn new(
        config: &EmailConfig,
        field: &str,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        config.check(field).map_err(anyhow::Error::msg)?;
        let tls = match config.tls {
            SmtpTls::None => Tls::None,
            mode => {
                let params = TlsParameters::new_rustls(config.host.clone())
                    .with_context(|| format!("{field}: TLS for {}", config.host))?;
                if mode == SmtpTls::Tls {
                    Tls::Wrapper(params)
                } else {
                    Tls::Required(params)
                }
            }
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&config.host)
            .port(config.port())
            .tls(tls)
            .timeout(Some(timeout));
        if let (Some(user), Some(password)) = (&config.user, config.password(field)?) {
            builder = builder.credentials(Credentials::new(user.clone(), password));
        }
        let to = config
            .to
            .iter()
            .map(|t| t.parse::<Mailbox>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| anyhow::anyhow!("{field}.to: not an email address"))?;
        Ok(Mailer {
            transport: builder.build(),
            from: config.from.parse()?,
            to: to.into_iter().collect(),
            host: config.host.clone(),
        })
    }

    /// Sends `notice` until it lands, the server refuses it for good, or the attempts run out.
    /// Whether it was delivered.
    pub(crate) async fn deliver(&self, notice: &Message, settings: &Settings) -> &'static str {
        let message = match message(&self.from, &self.to, notice) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(host = %self.host, id = %notice.id(), error = %e, "email notice could not be written");
                return "failed";
            }
        };
        let host = self.host.as_str();
        let id = notice.id();
        for attempts in 1..=settings.max_attempts {
            match self.transport.send(message.clone()).await {
                Ok(_) => {
                    tracing::info!(host, id, attempts, "email notice delivered");
                    return "delivered";
                }
                Err(e) if e.is_permanent() => {
                    tracing::error!(host, id, attempts, error = %e, "the SMTP server refused the email notice; not retried");
                    return "refused";
                }
                Err(e) => {
                    tracing::warn!(host, id, attempts, error = %e, "email notice delivery failed");
                }
            }
            if attempts < settings.max_attempts {
                tokio::time::sleep(settings.backoff.delay(attempts - 1)).await;
            }
        }
        tracing::error!(host, id, "email notice delivery given up");
        "failed"
    }
}

/// The email a notice becomes: a subject that says what happened, and a plain-text body with
/// the request and the link to the page where people sign. Nothing in it decides.
pub(crate) fn message(
    from: &Mailbox,
    to: &Mailboxes,
    notice: &Message,
) -> anyhow::Result<lettre::Message> {
    let (subject, body) = match notice {
        Message::Approval(n) => (subject(n), body(n)),
        Message::Grant(n) => (grant_subject(n), grant_body(n)),
    };
    let mut builder = lettre::Message::builder()
        .from(from.clone())
        .subject(subject)
        .header(ContentType::TEXT_PLAIN);
    for mailbox in to.iter() {
        builder = builder.to(mailbox.clone());
    }
    Ok(builder.body(body)?)
}

fn subject(n: &Notice) -> String {
    let what = match n.event {
        NoticeEvent::Requested => "Approval requested",
        NoticeEvent::Reminder => "Reminder: approval still waiting",
        NoticeEvent::Expired => "Approval expired unanswered",
    };
    let tool: String = n.tool.chars().filter(|c| !c.is_control()).collect();
    format!("[emisar] {what}: {tool} ({})", n.approval_id)
}

fn body(n: &Notice) -> String {
    let headline = match n.event {
        NoticeEvent::Requested => {
            "An agent asks for a write that needs people's approval.".to_owned()
        }
        NoticeEvent::Reminder => "This request is still waiting for people's approval.".to_owned(),
        NoticeEvent::Expired => format!(
            "This request expired unanswered after waiting {}: nothing ran. The agent was told; it must ask again if the write is still needed.",
            super::waited_text(n.waited_secs.unwrap_or_default())
        ),
    };
    let link = match &n.portal_url {
        Some(url) => format!("Review and sign it here: {url}"),
        None => format!("Review it in the portal: approval {}", n.approval_id),
    };
    format!(
        "{headline}\n\nTool:      {}\nRunners:   {}\nRequester: {}\nRisk:      {}\nReason:    {}\nExpires:   {}\n\n{link}\n\nThis message decides nothing: approving or denying happens on that page, signed by you.\n",
        n.tool,
        n.runners.join(", "),
        n.requester,
        n.risk,
        n.reason.split_whitespace().collect::<Vec<_>>().join(" "),
        n.expires_at,
    )
}

/// A grant's subject: a window's starts with `BREAK-GLASS`.
fn grant_subject(n: &GrantNotice) -> String {
    let clean = |s: &str| -> String { s.chars().filter(|c| !c.is_control()).collect() };
    let runners = clean(&n.runners.join(", "));
    let what = match n.event {
        GrantEvent::Requested => format!("Grant requested: {}", clean(&n.tools.join(", "))),
        GrantEvent::BreakGlassRequested => format!("BREAK-GLASS window requested on {runners}"),
        GrantEvent::BreakGlassOpen => format!("BREAK-GLASS window open on {runners}"),
        GrantEvent::BreakGlassCall => format!(
            "BREAK-GLASS call: {} on {runners}",
            clean(n.tool.as_deref().unwrap_or_default())
        ),
    };
    format!("[emisar] {what} ({})", n.grant_id)
}

fn grant_body(n: &GrantNotice) -> String {
    let headline = match n.event {
        GrantEvent::Requested => format!(
            "An agent asks for a grant: room to run these writes without a new round of people each, once {} people signed it.",
            n.required
        ),
        GrantEvent::BreakGlassRequested => format!(
            "BREAK-GLASS: {} asks to open a break-glass window, in which the agent runs any write on these runners without asking people, once {} people signed it.",
            n.requested_by, n.required
        ),
        GrantEvent::BreakGlassOpen => format!(
            "BREAK-GLASS: the window is open, signed by {}. The agent's writes on these runners run without asking people until it expires or is revoked; each one is announced.",
            n.signed_by.join(", ")
        ),
        GrantEvent::BreakGlassCall => format!(
            "BREAK-GLASS: a call inside window {}, run without asking people.",
            n.grant_id
        ),
    };
    let mut lines = vec![format!("Agent:     {}", n.agent)];
    match (&n.tool, &n.call_id) {
        (Some(tool), Some(call_id)) => {
            lines.push(format!("Tool:      {tool}"));
            lines.push(format!("Call:      {call_id}"));
        }
        _ => lines.push(format!("Tools:     {}", n.tools.join(", "))),
    }
    lines.push(format!("Runners:   {}", n.runners.join(", ")));
    lines.push(format!(
        "Reason:    {}",
        n.reason.split_whitespace().collect::<Vec<_>>().join(" ")
    ));
    lines.push(format!("Expires:   {}", n.expires_at));
    let link = match (&n.portal_url, n.event) {
        (Some(url), GrantEvent::Requested | GrantEvent::BreakGlassRequested) => {
            format!("Review and sign it here: {url}")
        }
        (Some(url), _) => format!("See it here: {url}"),
        (None, _) => format!("See it in the portal: grant {}", n.grant_id),
    };
    format!(
        "{headline}\n\n{}\n\n{link}\n\nThis message decides nothing: signing or revoking happens on that page, signed by you.\n",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> EmailConfig {
        toml::from_str(&format!(
            "host = \"smtp.example.com\"\nfrom = \"emisar <emisar@example.com>\"\nto = [\"ops@example.com\", \"lead@example.com\"]\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn checks_name_the_field_and_the_rule() {
        config("").check("notices.email[0]").unwrap();
        config("user = \"u\"\npassword_env = \"SMTP_PASSWORD\"")
            .check("notices.email[0]")
            .unwrap();
        let mut local = config("tls = \"none\"");
        local.host = "127.0.0.1".into();
        local.check("notices.email[0]").unwrap();
        let cases = [
            (
                "to = [\"ops@example.com\", \"not an address\"]",
                "notices.email[0].to[1]: not an email address",
            ),
            (
                "to = []",
                "notices.email[0].to: must list at least one address",
            ),
            (
                "from = \"nobody\"",
                "notices.email[0].from: not an email address",
            ),
            (
                "tls = \"none\"",
                "notices.email[0].tls: `none` is allowed only for a loopback host",
            ),
            (
                "user = \"u\"",
                "notices.email[0].user: set notices.email[0].password_file or notices.email[0].password_env",
            ),
            (
                "password_env = \"X\"",
                "notices.email[0].user: must be set when a password is",
            ),
            (
                "user = \"u\"\npassword_env = \"X\"\npassword_file = \"/p\"",
                "notices.email[0].password_file and notices.email[0].password_env: set at most one",
            ),
            (
                "port = 0",
                "notices.email[0].port: must be between 1 and 65535",
            ),
        ];
        for (extra, want) in cases {
            // `to`/`from` given twice: the later one replaces the default by re-parsing.
            let text = format!(
                "host = \"smtp.example.com\"\n{}",
                [
                    ("from", "from = \"emisar@example.com\""),
                    ("to", "to = [\"ops@example.com\"]")
                ]
                .iter()
                .filter(|(key, _)| !extra.starts_with(key))
                .map(|(_, line)| *line)
                .chain([extra])
                .collect::<Vec<_>>()
                .join("\n")
            );
            let c: EmailConfig = toml::from_str(&text).unwrap();
            let err = c.check("notices.email[0]").unwrap_err();
            assert!(err.starts_with(want), "{extra}: {err}");
        }
        assert!(
            toml::from_str::<EmailConfig>(
                "host = \"h\"\nfrom = \"a@b.c\"\nto = []\npassword = \"x\""
            )
            .is_err()
        );
    }

    #[test]
    fn the_message_links_to_the_signing_page_and_decides_nothing() {
        let notice = super::super::tests::notice(NoticeEvent::Requested);
        let c = config("");
        let to: Mailboxes = c.to.iter().map(|t| t.parse::<Mailbox>().unwrap()).collect();
        let text = String::from_utf8(
            message(&c.from.parse().unwrap(), &to, &notice.into())
                .unwrap()
                .formatted(),
        )
        .unwrap();
        assert!(
            text.contains("Subject: [emisar] Approval requested: nomad.task_resources_set (ap-1)"),
            "{text}"
        );
        assert!(
            text.contains("To: ops@example.com, lead@example.com"),
            "{text}"
        );
        assert!(
            text.contains("Review and sign it here: https://emisar.example/#/approvals/ap-1"),
            "{text}"
        );
        assert!(
            !text.to_lowercase().contains("approve?") && !text.contains("/approve"),
            "{text}"
        );
    }

    #[test]
    fn a_windows_call_says_break_glass_in_its_subject() {
        let mut call = crate::server::notices::grants::tests::notice(GrantEvent::BreakGlassCall);
        call.tool = Some("linux.systemctl_restart".into());
        call.call_id = Some("c-1".into());
        call.runners = vec!["edge-1".into()];
        let c = config("");
        let to: Mailboxes = c.to.iter().map(|t| t.parse::<Mailbox>().unwrap()).collect();
        let text = String::from_utf8(
            message(&c.from.parse().unwrap(), &to, &Message::Grant(call))
                .unwrap()
                .formatted(),
        )
        .unwrap();
        assert!(
            text.contains(
                "Subject: [emisar] BREAK-GLASS call: linux.systemctl_restart on edge-1 (g-1)"
            ),
            "{text}"
        );
        assert!(
            text.contains("See it here: https://emisar.example/#/grants/g-1"),
            "{text}"
        );
        assert!(text.contains("Call:      c-1"), "{text}");
    }
}
