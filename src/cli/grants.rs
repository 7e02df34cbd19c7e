//! `emisar grants`: list, show, approve (sign) and revoke people's grants to agents on a
//! running server. *Invariant:* `approve` reads the grant from its own text (the bytes it
//! signs), checks it is the grant asked for and lives no longer than `--max-lifetime`, and
//! shows it in words before it signs; it signs nothing the server only described.

use anyhow::Context;
use clap::Subcommand;
use serde_json::Value;

use crate::protocol::approval::grant::{Constraint, Grant, Runners};

use super::ServerArg;

#[derive(Subcommand)]
pub enum GrantsCommand {
    /// Grants, newest first, with how many calls remain of each.
    #[command(after_help = "Example: emisar grants list --status active")]
    List {
        /// requested, active, revoked or expired (all when left out).
        #[arg(long)]
        status: Option<String>,
    },
    /// One grant in full: what it allows, its uses so far, who signed, the text people sign.
    #[command(
        after_help = "Example: emisar grants show 0193f4d0-5d4f-7e3b-9a8c-1f2e3d4c5b6a --text"
    )]
    Show {
        /// The grant's id (from `emisar grants list`).
        id: String,
        /// Print only the text people sign, exactly as signed.
        #[arg(long)]
        text: bool,
    },
    /// Sign a grant with your SSH key (ssh-agent, or --ssh-key), after reading it in words.
    #[command(
        after_help = "Example: emisar grants approve 0193f4d0-5d4f-7e3b-9a8c-1f2e3d4c5b6a --ssh-key ~/.ssh/id_ed25519.pub"
    )]
    Approve {
        /// The grant's id (from `emisar grants list`).
        id: String,
        /// A note kept with your signature.
        #[arg(long)]
        note: Option<String>,
        /// The ssh-ed25519 key that signs: a private key file, or the .pub of one of the
        /// ssh-agent's keys. Default: the ssh-agent's only ssh-ed25519 key.
        #[arg(long, value_name = "PATH")]
        ssh_key: Option<std::path::PathBuf>,
        /// The longest a grant may live from its request to its expiry, in seconds: a grant
        /// that lives longer is not signed. Match the runners' max_grant_lifetime_secs.
        #[arg(long, value_name = "SECS", default_value_t = crate::protocol::approval::grant::DEFAULT_MAX_LIFETIME_SECS)]
        max_lifetime: u64,
    },
    /// Revoke a grant: nothing more runs under it, and every runner is told.
    #[command(
        after_help = "Example: emisar grants revoke 0193f4d0-5d4f-7e3b-9a8c-1f2e3d4c5b6a --reason 'incident over'"
    )]
    Revoke {
        /// The grant's id (from `emisar grants list`).
        id: String,
        /// Why; kept in the grant and its `grant.revoked` audit event.
        #[arg(long)]
        reason: String,
    },
}

/// The grant `text` in words, as the person about to sign it reads it.
pub(super) fn in_words(g: &Grant) -> String {
    let runners = match &g.runners {
        Runners::Names(names) => format!("only {}", names.join(", ")),
        Runners::Labels(selector) => format!("those whose labels match {selector}"),
    };
    let args = if g.args.is_empty() {
        "any (the runners' own allowlists still hold)".to_owned()
    } else {
        g.args
            .iter()
            .map(|(name, c)| match c {
                Constraint::In(values) => format!(
                    "{name} one of {}",
                    values
                        .iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Constraint::Range { min, max } => format!("{name} from {min} to {max}"),
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    format!(
        "  grant     {}\n  for       {}\n  tools     {}\n  runners   {runners}\n  arguments {args}\n  calls     at most {} in all, {} on one runner\n  expires   {}\n  needs     {} people's signatures\n  reason    {}\n",
        g.id,
        g.agent,
        g.tools.join(", "),
        g.max_calls,
        g.max_calls_per_runner,
        g.expires_at,
        g.required,
        g.reason.escape_debug(),
    )
}

/// Reads the grant `id` as `GET /api/grants/ID` answers it, from its own text, and checks
/// it before it is signed: the text is a grant's, in canonical form, of this id, and lives
/// no longer than `max_lifetime` and not past `now`. Returns the grant and its text.
pub(super) fn check_before_signing(
    id: &str,
    shown: &Value,
    now: u64,
    max_lifetime: u64,
) -> Result<(Grant, String), String> {
    let text = shown["text"]
        .as_str()
        .ok_or("the server's answer has no `text`")?;
    let grant = Grant::parse(text).map_err(|e| format!("the server's grant: {e}"))?;
    if grant.id != id {
        return Err(format!(
            "`grant`: the text is of grant {}, not {id}",
            grant.id
        ));
    }
    let expires = grant.expires_unix().map_err(|e| e.to_string())?;
    crate::protocol::approval::check_lifetime(&grant.id, expires, now, max_lifetime)
        .map_err(|e| format!("the grant: {}", e.replace("`approval`", "`grant`")))?;
    Ok((grant, text.to_owned()))
}

/// `emisar grants …`: the server's `/api/grants` with a person's token.
pub(super) async fn run(server: ServerArg, command: GrantsCommand) -> anyhow::Result<()> {
    let base = server
        .server
        .context("no server given: pass --server URL or set EMISAR_SERVER")?;
    let token = server
        .token
        .context("no token given: pass --token or set EMISAR_TOKEN (from `emisar user token`)")?;
    let base = base.trim_end_matches('/');
    let http = reqwest::Client::new();
    let send = |req: reqwest::RequestBuilder| async {
        let res = req.bearer_auth(&token).send().await?;
        let status = res.status();
        let body: Value = res.json().await.unwrap_or_default();
        if !status.is_success() {
            anyhow::bail!(
                "{}",
                body.get("error")
                    .and_then(|e| e.as_str())
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("HTTP {status}"))
            );
        }
        Ok::<_, anyhow::Error>(body)
    };
    match command {
        GrantsCommand::List { status } => {
            let mut req = http.get(format!("{base}/api/grants"));
            if let Some(status) = status {
                req = req.query(&[("status", status)]);
            }
            let body = send(req).await?;
            let rows = body["grants"].as_array().cloned().unwrap_or_default();
            if rows.is_empty() {
                println!("no grants");
            }
            for g in rows {
                println!(
                    "{}  {:<9} {} calls_left={}/{} signed={}/{} expires={}\n    tools: {}  reason: {}",
                    g["grant_id"].as_str().unwrap_or(""),
                    g["status"].as_str().unwrap_or(""),
                    g["agent"].as_str().unwrap_or(""),
                    g["calls_left"],
                    g["calls"],
                    g["signed_by"].as_array().map_or(0, Vec::len),
                    g["required"],
                    g["expires_at"].as_str().unwrap_or(""),
                    g["tools"],
                    g["reason"].as_str().unwrap_or("").escape_debug(),
                );
            }
        }
        GrantsCommand::Show { id, text } => {
            let body = send(http.get(format!("{base}/api/grants/{id}"))).await?;
            if text {
                print!("{}", body["text"].as_str().unwrap_or_default());
            } else {
                println!("{}", serde_json::to_string_pretty(&body)?);
            }
        }
        GrantsCommand::Approve {
            id,
            note,
            ssh_key,
            max_lifetime,
        } => {
            let shown = send(http.get(format!("{base}/api/grants/{id}"))).await?;
            let (grant, text) =
                check_before_signing(&id, &shown, crate::protocol::signing::now(), max_lifetime)
                    .map_err(|e| anyhow::anyhow!("{e}: not signed"))?;
            eprintln!(
                "signing grant {id} (sha256:{}):\n{}",
                crate::digest::sha256_hex(text.as_bytes()),
                in_words(&grant)
            );
            let armored = super::ssh_sign::sign(
                ssh_key.as_deref(),
                crate::protocol::approval::sshsig::APPROVAL_NAMESPACE,
                text.as_bytes(),
            )?;
            let signer = super::local_user(std::env::var("USER").ok());
            let body = send(http.post(format!("{base}/api/grants/{id}/approve")).json(
                &serde_json::json!({
                    "note": note,
                    "signature": {"kind": "ssh", "signer": signer, "signature": armored},
                }),
            ))
            .await?;
            let signed = body["signed_by"].as_array().map_or(0, Vec::len);
            match body["status"].as_str().unwrap_or("?") {
                "requested" => println!(
                    "{id}: requested ({signed} of {} signatures)",
                    body["required"]
                ),
                "active" => println!("{id}: active until {}", grant.expires_at),
                status => println!("{id}: {status}"),
            }
        }
        GrantsCommand::Revoke { id, reason } => {
            let body = send(
                http.post(format!("{base}/api/grants/{id}/revoke"))
                    .json(&serde_json::json!({"reason": reason})),
            )
            .await?;
            println!(
                "{id}: {}; the runners are being told",
                body["status"].as_str().unwrap_or("?")
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    const NOW: u64 = 1_796_551_200;

    fn sample() -> Grant {
        Grant {
            id: crate::protocol::approval::tests::id_at(NOW),
            agent: "agent:bot".into(),
            break_glass: false,
            tools: vec!["linux.systemctl_restart".into()],
            runners: Runners::Names(vec!["edge-1".into()]),
            args: BTreeMap::from([(
                "unit".into(),
                Constraint::In(vec![json!("consul"), json!("traefik")]),
            )]),
            max_calls: 3,
            max_calls_per_runner: 3,
            required: 2,
            reason: "INC-42".into(),
            expires_at: "2026-12-06T10:30:00Z".into(),
        }
    }

    #[test]
    fn a_grant_is_signed_only_as_its_own_text_says_and_within_the_lifetime() {
        let g = sample();
        let text = g.text().unwrap();
        let shown = json!({"text": text});
        let (read, signed) = check_before_signing(&g.id, &shown, NOW + 10, 3600).unwrap();
        assert_eq!(read, g);
        assert_eq!(signed, text);
        let words = in_words(&read);
        assert!(
            words.contains("unit one of \"consul\", \"traefik\""),
            "{words}"
        );
        assert!(words.contains("at most 3 in all"), "{words}");
        let other = crate::protocol::approval::tests::id_at(NOW + 1);
        let e = check_before_signing(&other, &shown, NOW + 10, 3600).unwrap_err();
        assert!(e.contains("`grant`"), "{e}");
        let e = check_before_signing(&g.id, &shown, NOW + 10, 600).unwrap_err();
        assert!(e.contains("600 s"), "{e}");
        let e = check_before_signing(
            &g.id,
            &json!({"text": text.replace("calls 3", "calls  3")}),
            NOW,
            3600,
        )
        .unwrap_err();
        assert!(e.contains("the server's grant"), "{e}");
    }
}
