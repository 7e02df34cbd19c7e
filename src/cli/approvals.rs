//! `emisar approvals`: list, show, approve and deny requests on a running server.

use anyhow::Context;
use clap::Subcommand;

use super::ServerArg;

#[derive(Subcommand)]
pub enum ApprovalsCommand {
    /// Requests in one state (pending by default), newest first.
    #[command(after_help = "Example: emisar approvals list --server https://emisar.example:7700")]
    List {
        /// pending, approved, denied, expired, withdrawn, executing, executed, failed or
        /// unknown.
        #[arg(long, default_value = "pending")]
        state: String,
    },
    /// One request in full: args, reason, requester, preview and the values its execution
    /// will use, votes, result.
    #[command(after_help = "Example: emisar approvals show 3f2a… --statement")]
    Show {
        /// The request's id (from `emisar approvals list`).
        id: String,
        /// Print only the statement people sign (for a request whose runners check
        /// signatures), exactly as signed.
        #[arg(long)]
        statement: bool,
    },
    /// Approve a request. When its runners check people's signatures, this signs the
    /// request's statement with your SSH key (ssh-agent, or --ssh-key) first.
    #[command(after_help = "Example: emisar approvals approve 3f2a… --note 'checked the preview'")]
    Approve {
        /// The request's id (from `emisar approvals list`).
        id: String,
        /// A note kept with your approval: in the request's votes (`approvals show`) and in
        /// its `approval.approved` audit event.
        #[arg(long)]
        note: Option<String>,
        /// The ssh-ed25519 key that signs: a private key file, or the .pub of one of the
        /// ssh-agent's keys. Default: the ssh-agent's only ssh-ed25519 key.
        #[arg(long, value_name = "PATH")]
        ssh_key: Option<std::path::PathBuf>,
    },
    /// Deny a request; the note reaches the agent.
    #[command(
        after_help = "Example: emisar approvals deny 3f2a… --note 'not during business hours'"
    )]
    Deny {
        /// The request's id (from `emisar approvals list`).
        id: String,
        /// Why not; the agent is told.
        #[arg(long)]
        note: String,
    },
}

/// Who signs, as the CLI can tell (the server records the token's person; the runners count
/// people by key).
fn whoami() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| crate::pack::is_identifier(u))
        .unwrap_or_else(|| "cli".into())
}

/// `emisar approvals …`: the server's `/api/approvals` with a person's token.
pub async fn run(server: ServerArg, command: ApprovalsCommand) -> anyhow::Result<()> {
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
        let body: serde_json::Value = res.json().await.unwrap_or_default();
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
        ApprovalsCommand::List { state } => {
            let body = send(
                http.get(format!("{base}/api/approvals"))
                    .query(&[("state", state)]),
            )
            .await?;
            let rows = body["approvals"].as_array().cloned().unwrap_or_default();
            if rows.is_empty() {
                println!("no requests");
            }
            for a in rows {
                println!(
                    "{}  {:<9} {:<32} runners={} by={} expires={}\n    reason: {}",
                    a["id"].as_str().unwrap_or(""),
                    a["state"].as_str().unwrap_or(""),
                    a["tool"].as_str().unwrap_or(""),
                    a["runners"],
                    a["requester"].as_str().unwrap_or(""),
                    a["expires_at"].as_str().unwrap_or(""),
                    a["reason"].as_str().unwrap_or("").escape_debug(),
                );
            }
        }
        ApprovalsCommand::Show { id, statement } => {
            let body = send(http.get(format!("{base}/api/approvals/{id}"))).await?;
            if !statement {
                println!("{}", serde_json::to_string_pretty(&body)?);
            } else if let Some(text) = body["statement"]["text"].as_str() {
                print!("{text}");
            } else {
                anyhow::bail!(
                    "request {id} has no statement: its runners do not check people's signatures"
                );
            }
        }
        ApprovalsCommand::Approve { id, note, ssh_key } => {
            let request = send(http.get(format!("{base}/api/approvals/{id}"))).await?;
            let signature = match request["statement"]["text"].as_str() {
                None => None,
                Some(text) => {
                    // The statement is checked before it is signed: the same text the runners
                    // will rebuild, so a server that sends something else gets nothing.
                    let parsed = crate::protocol::approval::Statement::parse(text)
                        .context("the server sent a statement that is not one")?;
                    if parsed.approval_id != id || request["tool"].as_str() != Some(&parsed.tool) {
                        anyhow::bail!(
                            "the server's statement names another request or tool than {id}: not signed"
                        );
                    }
                    eprintln!(
                        "signing the statement of {id} (sha256:{}):\n{text}",
                        request["statement"]["sha256"].as_str().unwrap_or("?")
                    );
                    let armored = super::ssh_sign::sign(
                        ssh_key.as_deref(),
                        crate::protocol::approval::sshsig::APPROVAL_NAMESPACE,
                        text.as_bytes(),
                    )?;
                    Some(
                        serde_json::json!({"kind": "ssh", "signer": whoami(), "signature": armored}),
                    )
                }
            };
            if signature.is_none() && ssh_key.is_some() {
                anyhow::bail!(
                    "--ssh-key: request {id} has no statement to sign (its runners do not check signatures); approve it without --ssh-key"
                );
            }
            let body = send(
                http.post(format!("{base}/api/approvals/{id}/approve"))
                    .json(&serde_json::json!({"note": note, "signature": signature})),
            )
            .await?;
            let state = body["state"].as_str().unwrap_or("?");
            let votes = body["approvals"].as_array().map_or(0, Vec::len);
            let required = body["required_approvals"].as_u64().unwrap_or(1);
            match state {
                "pending" => println!("{id}: pending ({votes} of {required} approvals)"),
                // The deciding approval claims the request for execution at once.
                "executing" => println!("{id}: approved; executing"),
                _ => println!("{id}: {state}"),
            }
        }
        ApprovalsCommand::Deny { id, note } => {
            let body = send(
                http.post(format!("{base}/api/approvals/{id}/deny"))
                    .json(&serde_json::json!({"note": note})),
            )
            .await?;
            println!("{id}: {}", body["state"].as_str().unwrap_or("?"));
        }
    }
    Ok(())
}
