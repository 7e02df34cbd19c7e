//! `emisar break-glass open`: people open a window (a grant flagged break-glass, signed
//! afterwards with `emisar grants approve`). `emisar break-glass review`: a person reads a closed break-glass window and every call made
//! inside it, then signs the review with a note (the first signer) or the review being signed
//! (the others), with their SSH key; and the text `emisar audit break-glass` prints.
//!
//! Invariant: what is signed is checked here first: the review's text must parse, name the
//! window shown and bind the SHA-256 of the window's grant text shown, so a server that shows
//! one window and asks for a signature over another gets nothing.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use serde_json::{Value, json};

use super::ServerArg;
use crate::protocol::approval::review::Review;
use crate::protocol::approval::sshsig::APPROVAL_NAMESPACE;
use crate::server::break_glass::Window;

#[derive(Subcommand)]
pub enum BreakGlassCommand {
    /// Open a break-glass window: one agent may run any write on these runners, for at most
    /// the server's max_grant_lifetime_secs, once enough people other than you signed it
    /// (`emisar grants approve ID --ssh-key`). Only runners whose approvers file says
    /// `break_glass = true` honour it.
    #[command(
        after_help = "Example: emisar break-glass open --runners edge-1,edge-2 --for agent:ops-bot --ttl-secs 1800 --reason \"INC-42: the edge is down\""
    )]
    Open {
        /// The runners, by name, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        runners: Vec<String>,
        /// The agent it is for, `agent:NAME`.
        #[arg(long = "for", value_name = "AGENT")]
        agent: String,
        /// How long it lives, in seconds (at most the server's max_grant_lifetime_secs).
        #[arg(long, default_value_t = 3600)]
        ttl_secs: u64,
        /// Why, as people read it when they sign.
        #[arg(long)]
        reason: String,
    },
    /// Review a closed break-glass window: shows the window and every call made inside it,
    /// then signs. The first signer gives the note; the others sign the review being signed
    /// (their --note, if any, must be the same).
    #[command(
        after_help = "Example: emisar break-glass review 0193f4d0-7a10-7cc0-9f00-000000000001 --note \"INC-42: restarted consul twice; runbook fixed\" --ssh-key ~/.ssh/id_ed25519"
    )]
    Review {
        /// The window's id (its grant's id).
        id: String,
        /// What was done inside the window and why (required to start a review; at most 4 KiB).
        #[arg(long)]
        note: Option<String>,
        /// The private key to sign with (or a .pub naming one of ssh-agent's keys).
        #[arg(long, value_name = "PATH")]
        ssh_key: Option<PathBuf>,
    },
}

/// `emisar break-glass …`: the server's `/api/break-glass` with a person's token.
pub(super) async fn run(server: ServerArg, command: BreakGlassCommand) -> anyhow::Result<()> {
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
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("HTTP {status}"))
            );
        }
        Ok::<_, anyhow::Error>(body)
    };
    let (id, note, ssh_key) = match command {
        BreakGlassCommand::Open {
            runners,
            agent,
            ttl_secs,
            reason,
        } => {
            let body = send(http.post(format!("{base}/api/break-glass")).json(&json!({
                "runners": runners, "agent": agent, "ttl_secs": ttl_secs, "reason": reason,
            })))
            .await?;
            println!(
                "break-glass window {} opened for {agent} until {}: {} people must sign it (`emisar grants approve {} --ssh-key PATH`)",
                body["grant_id"].as_str().unwrap_or("?"),
                body["expires_at"].as_str().unwrap_or("?"),
                body["required"],
                body["grant_id"].as_str().unwrap_or("?"),
            );
            return Ok(());
        }
        BreakGlassCommand::Review { id, note, ssh_key } => (id, note, ssh_key),
    };
    let shown = send(http.get(format!("{base}/api/break-glass/{id}"))).await?;
    let window: Window = serde_json::from_value(shown["window"].clone())
        .context("the server's answer is not a break-glass window")?;
    eprint!("{}", windows_text(std::slice::from_ref(&window)));
    let pending = shown["review"]["text"].as_str();
    let text = review_to_sign(&window, pending, note.as_deref())?;
    let review = Review::parse(&text)?;
    eprintln!(
        "signing the review of window {id} (sha256:{}), note:\n{}",
        crate::digest::sha256_hex(text.as_bytes()),
        shown_note(&review.note)
    );
    let armored = super::ssh_sign::sign(ssh_key.as_deref(), APPROVAL_NAMESPACE, text.as_bytes())?;
    let signature =
        json!({"kind": "ssh", "signer": super::approvals::whoami(), "signature": armored});
    let body = send(
        http.post(format!("{base}/api/break-glass/{id}/review"))
            .json(&json!({"text": text, "signature": signature})),
    )
    .await?;
    let votes = body["review"]["votes"].as_array().map_or(0, Vec::len);
    match body["review"]["status"].as_str() {
        Some("reviewed") => println!("{id}: reviewed ({votes} people signed)"),
        _ => println!("{id}: signing the review ({votes} signed so far)"),
    }
    Ok(())
}

/// The review's text to sign for `window`: the one being signed (`pending`), checked to bind
/// this window, to be dated after the window closed (as shown) and not in the future, and, if
/// `note` is given, to carry it; or a new one with `note`, now.
pub(super) fn review_to_sign(
    window: &Window,
    pending: Option<&str>,
    note: Option<&str>,
) -> anyhow::Result<String> {
    let Some(text) = pending else {
        let note = note.unwrap_or_default();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        return Ok(Review::of(&window.text, note, &now)?.text()?);
    };
    let review = Review::parse(text)?;
    if review.window != window.id
        || review.grant_sha256 != crate::digest::sha256_hex(window.text.as_bytes())
    {
        anyhow::bail!(
            "the review being signed is of another window than {} as shown: not signed",
            window.id
        );
    }
    let now = crate::protocol::signing::now();
    let closed = window.closed_unix(now).unwrap_or(u64::MAX);
    crate::protocol::approval::review::check_unsigned(&window.text, text, now, closed)
        .map_err(|e| anyhow::anyhow!("the review being signed does not hold, not signed: {e}"))?;
    if let Some(note) = note
        && note != review.note
    {
        anyhow::bail!(
            "`note`: window {} is being reviewed with another note, which you sign as it is (leave --note out): {:?}",
            window.id,
            review.note
        );
    }
    Ok(text.to_owned())
}

/// A note as a signer reads it in a terminal: every control, invisible or bidirectional
/// formatting character escaped (`\u{200b}`, `\u{202e}`), so what is signed cannot look like
/// something else or like nothing; line breaks stay line breaks.
pub(super) fn shown_note(note: &str) -> String {
    note.split('\n')
        .map(|line| line.escape_debug().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Windows as a person reads them: one paragraph each, its calls and its review.
pub(super) fn windows_text(windows: &[Window]) -> String {
    let mut out = String::new();
    if windows.is_empty() {
        out.push_str("no break-glass windows\n");
    }
    for w in windows {
        let _ = writeln!(
            out,
            "{}  {}  agent={} runners={} expires={}\n    opened by {} at {}; signed by {}\n    reason: {}",
            w.id,
            w.state.as_str(),
            w.agent,
            w.runners.join(","),
            w.expires_at,
            w.opened_by,
            w.opened_at,
            if w.signed_by.is_empty() {
                "nobody yet".to_owned()
            } else {
                w.signed_by.join(", ")
            },
            w.reason.escape_debug(),
        );
        if let Some((at, why)) = &w.closed {
            let _ = writeln!(out, "    {why} at {at}");
        }
        let _ = writeln!(out, "    {} calls inside it", w.calls.len());
        for c in &w.calls {
            let _ = writeln!(
                out,
                "      {}  {}  {} on {}  by {}",
                c.at,
                c.call_id.as_deref().unwrap_or("-"),
                c.tool.as_deref().unwrap_or("?"),
                c.runners.join(","),
                c.actor
            );
        }
        match &w.review {
            Some(r) => {
                let _ = writeln!(
                    out,
                    "    reviewed at {} by {} (signed by {}): {}",
                    r.at,
                    r.actor,
                    r.signed_by.join(", "),
                    r.note.escape_debug()
                );
            }
            None => out.push_str("    not reviewed\n"),
        }
        if let Some(why) = &w.review_refused {
            let _ = writeln!(out, "    review refused: {}", why.escape_debug());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::protocol::approval::grant::{Grant, Runners};
    use crate::protocol::approval::tests::id_at;
    use crate::server::break_glass::State;

    fn window(runners: &[&str]) -> Window {
        let grant = Grant {
            id: id_at(1_796_551_200),
            agent: "agent:ops-bot".into(),
            break_glass: true,
            tools: vec!["*".into()],
            runners: Runners::Names(runners.iter().map(|r| (*r).to_owned()).collect()),
            args: BTreeMap::new(),
            max_calls: 10,
            max_calls_per_runner: 10,
            required: 2,
            reason: "INC-1".into(),
            expires_at: "2026-12-06T11:00:00Z".into(),
        };
        Window {
            id: grant.id.clone(),
            state: State::ClosedUnreviewed,
            agent: grant.agent.clone(),
            runners: runners.iter().map(|r| (*r).to_owned()).collect(),
            reason: grant.reason.clone(),
            expires_at: grant.expires_at.clone(),
            required: 2,
            opened_by: "approver:alice".into(),
            opened_at: "2026-12-06T10:00:00.000000Z".into(),
            signed_by: vec!["alice".into(), "bob".into()],
            active_at: None,
            closed: None,
            calls: Vec::new(),
            review: None,
            review_refused: None,
            text: grant.text().unwrap(),
        }
    }

    /// The signer signs only a review of the window shown, with its note, and a new review
    /// needs a note.
    #[test]
    fn a_signer_signs_only_a_review_of_the_window_shown() {
        let shown = window(&["edge-1"]);
        let e = review_to_sign(&shown, None, None).unwrap_err().to_string();
        assert!(e.contains("`note` is required"), "{e}");
        let text = review_to_sign(&shown, None, Some("restarted consul")).unwrap();
        assert_eq!(Review::parse(&text).unwrap().note, "restarted consul");
        assert_eq!(review_to_sign(&shown, Some(&text), None).unwrap(), text);
        let e = review_to_sign(&shown, Some(&text), Some("other"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("another note"), "{e}");
        // A review of the same id over a wider window's text is not this window's.
        let wider = window(&["edge-1", "edge-2"]);
        let other = review_to_sign(&wider, None, Some("restarted consul")).unwrap();
        let e = review_to_sign(&shown, Some(&other), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("another window"), "{e}");
        // A review dated before the window closed (its expiry, 11:00) is not signed.
        let early = Review::of(&shown.text, "all fine", "2026-12-06T10:59:59Z")
            .unwrap()
            .text()
            .unwrap();
        let e = review_to_sign(&shown, Some(&early), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`reviewed`: 2026-12-06T10:59:59Z is before the window closed"),
            "{e}"
        );
        let listed = windows_text(&[shown]);
        assert!(listed.contains("closed-unreviewed"), "{listed}");
        assert!(listed.contains("not reviewed"), "{listed}");
    }

    /// What a signer reads of a note shows every invisible and bidirectional character as an
    /// escape, never raw; the listing does too, and says why a review event does not count.
    #[test]
    fn a_note_is_shown_escaped() {
        let note = "restarted consul \u{202e}DB DORP\u{202c} once\u{200b}\nrunbook: \"fixed\"";
        let shown = shown_note(note);
        assert_eq!(
            shown,
            "restarted consul \\u{202e}DB DORP\\u{202c} once\\u{200b}\nrunbook: \\\"fixed\\\""
        );
        assert!(!shown.contains('\u{202e}') && !shown.contains('\u{200b}'));
        let mut w = window(&["edge-1"]);
        w.review_refused = Some("the review event #9 does not count: bad \u{202e}".into());
        let listed = windows_text(&[w]);
        assert!(
            listed.contains("review refused: the review event #9 does not count: bad \\u{202e}"),
            "{listed}"
        );
    }
}
