//! `emisar approvals`: list, show, approve and deny requests on a running server.

use anyhow::Context;
use clap::Subcommand;
use serde_json::{Map, Value};

use crate::protocol::approval::{Choice, Statement};

use super::ServerArg;

#[derive(Subcommand)]
pub enum ApprovalsCommand {
    /// Requests in one state (pending by default), newest first.
    #[command(after_help = "Example: emisar approvals list --server https://emisar.example:7700")]
    List {
        /// pending, approved, denied, expired, withdrawn, executing, executed, failed,
        /// halted, aborted or unknown.
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
        /// The longest an approval may live from its request to its expiry, in seconds: a
        /// statement that lives longer is not signed. Default 1260 (the server's default 15 min
        /// approval_ttl_secs, 5 min approved_start_within_secs, and a minute); match the
        /// runners' max_approval_lifetime_secs.
        #[arg(long, value_name = "SECS", default_value_t = crate::protocol::approval::DEFAULT_MAX_LIFETIME_SECS)]
        max_lifetime: u64,
    },
    /// Resume a halted rollout: run the runners the halt left unrun, each in its signed wave.
    /// Proposes the decision (or joins the pending one) and votes for it, signing its text
    /// with your SSH key when the request's runners check people's signatures.
    #[command(after_help = "Example: emisar approvals resume 3f2a… --note 'edge-2 is fine again'")]
    Resume(DecisionArgs),
    /// Retry a halted rollout: run the runner whose write or gate failed again, then the
    /// runners left unrun; signed as for `resume`.
    #[command(
        after_help = "Example: emisar approvals retry 3f2a… --note 'restarted the agent on edge-2'"
    )]
    Retry(DecisionArgs),
    /// Abort a halted rollout: nothing more runs (one person's signed vote is enough).
    #[command(after_help = "Example: emisar approvals abort 3f2a… --note 'rolling back by hand'")]
    Abort(DecisionArgs),
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

/// What `resume`, `retry` and `abort` take.
#[derive(clap::Args)]
pub struct DecisionArgs {
    /// The halted request's id (from `emisar approvals list --state halted`).
    id: String,
    /// A note kept with your vote (and in its `rollout.decided` audit event).
    #[arg(long)]
    note: Option<String>,
    /// The ssh-ed25519 key that signs, as for `approve`.
    #[arg(long, value_name = "PATH")]
    ssh_key: Option<std::path::PathBuf>,
    /// The longest a decision may live from its proposal to its expiry, in seconds, as for
    /// `approve`.
    #[arg(long, value_name = "SECS", default_value_t = crate::protocol::approval::DEFAULT_MAX_LIFETIME_SECS)]
    max_lifetime: u64,
}

/// Checks the pending decision of `request` (as the decision's proposal answers) before it is
/// signed: it is the `choice` asked for, about this request and the very statement shown,
/// names exactly the runners its halt leaves (plus the failed one, for a retry), and lives
/// no longer than `max_lifetime`. Returns what is signed as people should read it; an error
/// names the decision's field.
pub(super) fn check_decision_before_signing(
    id: &str,
    choice: crate::protocol::approval::Choice,
    request: &serde_json::Value,
    now: u64,
    max_lifetime: u64,
) -> Result<String, String> {
    use crate::protocol::approval::{Decision, check_lifetime, statement::hash_text};
    let text = request["decision"]["text"]
        .as_str()
        .ok_or("the request has no decision to sign")?;
    let d = Decision::parse(text).map_err(|e| format!("the server's decision: {e}"))?;
    if d.approval_id != id {
        return Err(format!(
            "`approval`: the decision is about approval {}, not {id}",
            d.approval_id
        ));
    }
    if d.choice != choice {
        return Err(format!(
            "`choice`: the decision is a {}, not a {}",
            d.choice.as_str(),
            choice.as_str()
        ));
    }
    let statement = request["statement"]["text"].as_str().unwrap_or("");
    if d.statement_sha256 != hex::encode(hash_text(statement)) {
        return Err("`statement`: the decision binds another statement than the request's".into());
    }
    let halt: crate::server::approvals::Halt =
        serde_json::from_value(request["result"]["halt"].clone())
            .map_err(|_| "`runners`: the request does not show where its rollout halted")?;
    let wanted = crate::server::approvals::halted::runners_for(&halt, choice);
    if d.runners != wanted || d.halted_wave != halt.wave {
        return Err(format!(
            "`runners`: the decision lets {:?} run after wave {}, and the request's halt (wave {}, failed {:?}, not run {:?}) gives {wanted:?}",
            d.runners, d.halted_wave, halt.wave, halt.runner, halt.not_run
        ));
    }
    let expires = d.expires_unix().map_err(|e| e.to_string())?;
    check_lifetime(&d.id, expires, now, max_lifetime)
        .map_err(|e| e.replace("`approval`", "`decision`"))?;
    let runners = if d.runners.is_empty() {
        "none".to_owned()
    } else {
        d.runners.join(", ")
    };
    Ok(format!(
        "  {}    approval {id}, halted in wave {} (failed: {})\n  runners  {runners}, each in its wave of the signed plan\n  expires  {}\n",
        d.choice.as_str(),
        halt.wave,
        halt.runner.as_deref().unwrap_or("none"),
        d.expires_at
    ))
}

/// Who signs, as the CLI can tell (the server records the token's person; the runners count
/// people by key).
pub(super) fn whoami() -> String {
    super::local_user(std::env::var("USER").ok())
}

/// Checks the statement of `request` (as `GET /api/approvals/ID` answers) against what the
/// request shows, line by line, and returns what is signed as people should read it. Nothing
/// the server computed is trusted: the `args` digest is recomputed from the arguments shown
/// (secret params as their commitments, the shown value sealed), each runner's preview digest
/// from the values it sealed, and the runners, the count of people, the tool and the id are
/// compared with the request's; the lifetime is bounded by `max_lifetime`. An error names the
/// statement's field.
pub fn check_before_signing(
    id: &str,
    request: &serde_json::Value,
    now: u64,
    max_lifetime: u64,
) -> Result<String, String> {
    use crate::protocol::approval::{Statement, check_lifetime};
    let text = request["statement"]["text"]
        .as_str()
        .ok_or("the request has no statement")?;
    let st = Statement::parse(text).map_err(|e| format!("the server's statement: {e}"))?;
    check_approval_and_tool(id, &st, request)?;
    let signed = signed_args(&st, request)?;
    check_runners(&st, request)?;
    let mut out = format!(
        "  tool     {}\n  args     {}\n",
        st.tool,
        crate::digest::canonical_json(&Value::Object(signed.clone()))
    );
    out.push_str(&preview_lines(&st, request)?);
    out.push_str(&plan_lines(&st, request)?);
    check_requester_and_required(&st, request)?;
    let expires = st.expires_unix().map_err(|e| e.to_string())?;
    check_lifetime(id, expires, now, max_lifetime)?;
    out.push_str(&format!(
        "  required {}\n  expires  {}\n",
        st.required, st.expires_at
    ));
    Ok(out)
}

/// `approval` and `tool`: the statement is about request `id`, and its tool is the one the
/// request shows.
fn check_approval_and_tool(id: &str, st: &Statement, request: &Value) -> Result<(), String> {
    if st.approval_id != id {
        return Err(format!(
            "`approval`: the statement names approval {}, not {id}",
            st.approval_id
        ));
    }
    if request["tool"].as_str() != Some(st.tool.as_str()) {
        return Err(format!(
            "`tool`: the statement names `{}`, the request shows {}",
            st.tool, request["tool"]
        ));
    }
    Ok(())
}

/// `args`: the statement's digest is of the arguments the server sent with it, and these are
/// the ones the request shows. Returns them.
fn signed_args<'r>(st: &Statement, request: &'r Value) -> Result<&'r Map<String, Value>, String> {
    let signed = request["statement"]["args"]
        .as_object()
        .ok_or("`args`: the server sent no arguments for the statement's digest")?;
    if crate::digest::json_digest(&Value::Object(signed.clone())) != st.args_sha256 {
        return Err(
            "`args`: the statement's digest is not the digest of the arguments shown".into(),
        );
    }
    let shown = request["args"]
        .as_object()
        .ok_or("`args`: the request shows no arguments")?;
    if shown.len() != signed.len() {
        return Err("`args`: the statement covers other arguments than the request shows".into());
    }
    for (k, v) in signed {
        if !shows_signed_arg(v, shown.get(k)) {
            return Err(format!(
                "`args`: `{k}` is {} in the statement and {} in the request shown",
                v,
                shown.get(k).unwrap_or(&Value::Null)
            ));
        }
    }
    Ok(signed)
}

/// Whether the request shows the argument the statement signed (`signed`) as `shown`: the
/// same value, or for a secret param (signed as its commitment) a sealed one.
fn shows_signed_arg(signed: &Value, shown: Option<&Value>) -> bool {
    use crate::protocol::approval::statement::COMMIT_PREFIX;
    match (signed.as_str(), shown) {
        (Some(c), Some(Value::String(sealed))) if c.starts_with(COMMIT_PREFIX) => {
            sealed.starts_with("hmac-sha256:")
        }
        (_, Some(s)) => s == signed,
        (_, None) => false,
    }
}

/// `runner`: the statement names the runners the request shows, in any order.
fn check_runners(st: &Statement, request: &Value) -> Result<(), String> {
    let mut wanted: Vec<&str> = request["runners"]
        .as_array()
        .ok_or("`runner`: the request shows no runners")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut listed: Vec<&str> = st.runners.keys().map(String::as_str).collect();
    listed.sort_unstable();
    wanted.sort_unstable();
    if listed != wanted {
        return Err(format!(
            "`runner`: the statement names {listed:?}, the request shows {wanted:?}"
        ));
    }
    Ok(())
}

/// `runner R preview`: each runner's preview digest is the digest of the values the request
/// shows it sealed (none, for a runner the statement gives none). Returns a line per runner
/// with those values.
fn preview_lines(st: &Statement, request: &Value) -> Result<String, String> {
    let mut lines = String::new();
    for (runner, digest) in &st.runners {
        let sealed = request["preview"][runner]["sealed_vars"].as_str();
        let vars = match sealed {
            Some(t) => Some(serde_json::from_str::<Value>(t).map_err(|_| {
                format!("`runner {runner} preview`: the sealed values are not JSON")
            })?),
            None => None,
        };
        if vars.as_ref().map(crate::digest::json_digest) != *digest {
            return Err(format!(
                "`runner {runner} preview`: the statement's digest is not the digest of the preview values shown"
            ));
        }
        lines.push_str(&format!(
            "  runner   {runner}, preview values {}\n",
            vars.as_ref()
                .map_or_else(|| "none".to_owned(), crate::digest::canonical_json)
        ));
    }
    Ok(lines)
}

/// `wave`: the rollout signed is the plan the request shows. Returns it as lines, wave by
/// wave, and the pause between them.
fn plan_lines(st: &Statement, request: &Value) -> Result<String, String> {
    let shown_plan = serde_json::to_value(&st.plan).expect("a plan is JSON");
    if request["plan"] != shown_plan {
        return Err(format!(
            "`wave`: the statement's rollout is {shown_plan}, the request shows {}",
            request["plan"]
        ));
    }
    let mut lines = String::new();
    for (i, wave) in st.plan.waves.iter().enumerate() {
        lines.push_str(&format!("  wave {}   {}\n", i + 1, wave.join(", ")));
    }
    lines.push_str(&format!(
        "  pause    {} s between waves\n",
        st.plan.pause_secs
    ));
    Ok(lines)
}

/// `requester` and `required`: the statement's requester and count of people are the ones the
/// request shows (a store could show a trusted name, or fewer people).
fn check_requester_and_required(st: &Statement, request: &Value) -> Result<(), String> {
    if request["requester"].as_str() != Some(st.requester.as_str()) {
        return Err(format!(
            "`requester`: the statement says `{}`, the request shows {}",
            st.requester, request["requester"]
        ));
    }
    if request["required_approvals"].as_u64() != Some(u64::from(st.required)) {
        return Err(format!(
            "`required`: the statement says {}, the request shows {}",
            st.required, request["required_approvals"]
        ));
    }
    Ok(())
}

/// `emisar approvals …`: the server's `/api/approvals` with a person's token.
pub(super) async fn run(server: ServerArg, command: ApprovalsCommand) -> anyhow::Result<()> {
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
        ApprovalsCommand::Approve {
            id,
            note,
            ssh_key,
            max_lifetime,
        } => {
            let request = send(http.get(format!("{base}/api/approvals/{id}"))).await?;
            let signature = match request["statement"]["text"].as_str() {
                None => None,
                Some(text) => {
                    // Every line of the statement is recomputed from what is shown here
                    // before it is signed; a server (or a database writer) that shows one
                    // write and asks for a signature over another gets nothing.
                    let shown = check_before_signing(
                        &id,
                        &request,
                        crate::protocol::signing::now(),
                        max_lifetime,
                    )
                    .map_err(|e| anyhow::anyhow!("{e}: not signed"))?;
                    eprintln!(
                        "signing approval {id} (statement sha256:{}):\n{shown}",
                        crate::digest::sha256_hex(text.as_bytes())
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
        ApprovalsCommand::Resume(args) => {
            decide_halted(&http, base, &send, Choice::Resume, args).await?
        }
        ApprovalsCommand::Retry(args) => {
            decide_halted(&http, base, &send, Choice::Retry, args).await?
        }
        ApprovalsCommand::Abort(args) => {
            decide_halted(&http, base, &send, Choice::Abort, args).await?
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

/// `resume`, `retry`, `abort`: proposes the decision (or finds the pending one), checks it,
/// signs it where people sign, and votes for it.
async fn decide_halted<S, F>(
    http: &reqwest::Client,
    base: &str,
    send: &S,
    choice: crate::protocol::approval::Choice,
    args: DecisionArgs,
) -> anyhow::Result<()>
where
    S: Fn(reqwest::RequestBuilder) -> F,
    F: std::future::Future<Output = anyhow::Result<serde_json::Value>>,
{
    let id = &args.id;
    let request = send(
        http.post(format!("{base}/api/approvals/{id}/decision"))
            .json(&serde_json::json!({"choice": choice.as_str()})),
    )
    .await?;
    let decision_id = request["decision"]["id"]
        .as_str()
        .context("the server's answer has no decision")?
        .to_owned();
    let signature = match request["statement"]["text"].as_str() {
        None => None,
        Some(_) => {
            // Nothing the server computed is trusted: the decision is checked against the
            // request shown (its statement, its halt) before it is signed.
            let shown = check_decision_before_signing(
                id,
                choice,
                &request,
                crate::protocol::signing::now(),
                args.max_lifetime,
            )
            .map_err(|e| anyhow::anyhow!("{e}: not signed"))?;
            let text = request["decision"]["text"].as_str().unwrap_or_default();
            eprintln!(
                "signing decision {decision_id} (sha256:{}):\n{shown}",
                crate::digest::sha256_hex(text.as_bytes())
            );
            let armored = super::ssh_sign::sign(
                args.ssh_key.as_deref(),
                crate::protocol::approval::sshsig::APPROVAL_NAMESPACE,
                text.as_bytes(),
            )?;
            Some(serde_json::json!({"kind": "ssh", "signer": whoami(), "signature": armored}))
        }
    };
    let body = send(
        http.post(format!("{base}/api/approvals/{id}/decision/vote"))
            .json(&serde_json::json!({"decision_id": decision_id, "note": args.note, "signature": signature})),
    )
    .await?;
    let votes = body["decision"]["votes"].as_array().map_or(0, Vec::len);
    let required = body["decision"]["required"].as_u64().unwrap_or(1);
    match body["state"].as_str().unwrap_or("?") {
        "halted" => println!(
            "{id}: {} decision {decision_id} pending ({votes} of {required} people)",
            choice.as_str()
        ),
        "executing" => println!("{id}: {}; executing", choice.as_str()),
        state => println!("{id}: {state}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::json_digest;
    use crate::protocol::approval::tests::id_at;
    use crate::protocol::approval::{Plan, Statement};
    use serde_json::{Value, json};

    const NOW: u64 = 1_796_551_200;

    /// A request as `GET /api/approvals/ID` shows it: a secret param, two runners, one with a
    /// preview, and its statement.
    fn request() -> (String, Value) {
        let id = id_at(NOW - 60);
        let signed =
            json!({"unit": "consul", "token": "commit:sha256:".to_owned() + &"e".repeat(64)});
        let vars = json!({"state": "active", "restarts": 3});
        let st = Statement {
            approval_id: id.clone(),
            tool: "linux.systemctl_restart".into(),
            pack_sha256: "a".repeat(64),
            args_sha256: json_digest(&signed),
            runners: [
                ("hvn05".to_owned(), Some(json_digest(&vars))),
                ("hvn06".to_owned(), None),
            ]
            .into(),
            plan: Plan {
                waves: vec![vec!["hvn06".into()], vec!["hvn05".into()]],
                pause_secs: 30,
            },
            required: 2,
            policy_sha256: "d".repeat(64),
            requester: "agent:a".into(),
            expires_at: "2026-12-06T10:20:00Z".into(),
        };
        let text = st.text().unwrap();
        let request = json!({
            "id": id, "tool": "linux.systemctl_restart",
            "args": {"unit": "consul", "token": "hmac-sha256:".to_owned() + &"f".repeat(64)},
            "runners": ["hvn06", "hvn05"], "required_approvals": 2, "requester": "agent:a",
            "preview": {"hvn05": {"sealed_vars": vars.to_string()}},
            "statement": {"text": text, "args": signed},
            "plan": {"waves": [["hvn06"], ["hvn05"]], "pause_secs": 30},
        });
        (id, request)
    }

    #[test]
    fn a_statement_is_signed_only_as_the_request_shows_it() {
        let (id, r) = request();
        let shown = check_before_signing(&id, &r, NOW, 1260).unwrap();
        assert!(
            shown.contains(r#"preview values {"restarts":3,"state":"active"}"#)
                && shown.contains("wave 1   hvn06\n  wave 2   hvn05\n"),
            "{shown}"
        );
        let edit = |f: &dyn Fn(&mut Value)| {
            let mut r = r.clone();
            f(&mut r);
            check_before_signing(&id, &r, NOW, 1260).unwrap_err()
        };
        type Edit = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|r| r["args"]["unit"] = json!("nomad")),
                "`args`: `unit`",
            ),
            (
                Box::new(|r| r["statement"]["args"]["unit"] = json!("nomad")),
                "`args`: the statement's digest",
            ),
            (
                Box::new(|r| r["args"]["token"] = json!("plain")),
                "`args`: `token`",
            ),
            (
                Box::new(|r| r["args"]["extra"] = json!(1)),
                "`args`: the statement covers other",
            ),
            (Box::new(|r| r["runners"] = json!(["hvn05"])), "`runner`"),
            (
                Box::new(|r| r["preview"]["hvn05"]["sealed_vars"] = json!(r#"{"state":"failed"}"#)),
                "`runner hvn05 preview`",
            ),
            (
                Box::new(|r| r["preview"]["hvn06"] = json!({"sealed_vars": "{}"})),
                "`runner hvn06 preview`",
            ),
            (
                Box::new(|r| r["required_approvals"] = json!(3)),
                "`required`",
            ),
            // The requester shown is the one signed (a store could show a trusted name).
            (
                Box::new(|r| r["requester"] = json!("agent:trusted-bot")),
                "`requester`",
            ),
            (
                Box::new(|r| r["tool"] = json!("linux.systemctl_reload")),
                "`tool`",
            ),
            // A rollout shown otherwise than signed: all at once, or another canary.
            (
                Box::new(|r| r["plan"]["waves"] = json!([["hvn05", "hvn06"]])),
                "`wave`",
            ),
            (
                Box::new(|r| r["plan"]["waves"] = json!([["hvn05"], ["hvn06"]])),
                "`wave`",
            ),
        ];
        for (f, why) in cases {
            let e = edit(&*f);
            assert!(e.contains(why), "`{e}` does not say `{why}`");
        }
        // Another request's statement.
        let e = check_before_signing(&id_at(NOW), &r, NOW, 1260).unwrap_err();
        assert!(e.contains("`approval`"), "{e}");
    }

    /// The request of [`request`], halted at its canary, with a pending decision.
    fn halted(choice: &str, runners: &[&str]) -> (String, Value) {
        let (id, mut r) = request();
        let statement = r["statement"]["text"].as_str().unwrap().to_owned();
        let d = crate::protocol::approval::Decision {
            id: id_at(NOW - 10),
            approval_id: id.clone(),
            statement_sha256: crate::digest::sha256_hex(statement.as_bytes()),
            halted_wave: 1,
            choice: crate::protocol::approval::Choice::parse(choice).unwrap(),
            runners: runners.iter().map(|s| (*s).to_owned()).collect(),
            expires_at: "2026-12-06T10:19:00Z".into(),
        };
        r["result"] = json!({"halt": {"wave": 1, "runner": "hvn06", "not_run": ["hvn05"]}});
        r["decision"] = json!({"text": d.text().unwrap()});
        (id, r)
    }

    #[test]
    fn a_rollout_decision_is_signed_only_for_the_halt_the_request_shows() {
        use crate::protocol::approval::Choice;
        let (id, r) = halted("retry", &["hvn05", "hvn06"]);
        let shown = check_decision_before_signing(&id, Choice::Retry, &r, NOW, 1260).unwrap();
        assert!(shown.contains("runners  hvn05, hvn06"), "{shown}");
        // Another choice than the one asked for.
        let e = check_decision_before_signing(&id, Choice::Resume, &r, NOW, 1260).unwrap_err();
        assert!(e.starts_with("`choice`"), "{e}");
        // A resume that would run the failed runner again.
        let (id, r) = halted("resume", &["hvn05", "hvn06"]);
        let e = check_decision_before_signing(&id, Choice::Resume, &r, NOW, 1260).unwrap_err();
        assert!(e.starts_with("`runners`"), "{e}");
        // A decision bound to another statement than the one shown.
        let (id, mut r) = halted("resume", &["hvn05"]);
        assert!(check_decision_before_signing(&id, Choice::Resume, &r, NOW, 1260).is_ok());
        r["statement"]["text"] = json!("another\n");
        let e = check_decision_before_signing(&id, Choice::Resume, &r, NOW, 1260).unwrap_err();
        assert!(e.starts_with("`statement`"), "{e}");
        // One that lives longer than allowed.
        let (id, r) = halted("abort", &[]);
        let e = check_decision_before_signing(&id, Choice::Abort, &r, NOW, 60).unwrap_err();
        assert!(e.starts_with("`expires`"), "{e}");
    }

    #[test]
    fn a_far_or_past_expiry_is_not_signed() {
        let (id, r) = request();
        let text = r["statement"]["text"].as_str().unwrap().to_owned();
        let mut far = r.clone();
        far["statement"]["text"] =
            json!(text.replace("2026-12-06T10:20:00Z", "2099-01-01T00:00:00Z"));
        let e = check_before_signing(&id, &far, NOW, 1260).unwrap_err();
        assert!(e.starts_with("`expires`"), "{e}");
        let e = check_before_signing(&id, &r, NOW + 1200, 1260).unwrap_err();
        assert!(e.contains("expired"), "{e}");
        // A longer lifetime is signed only when the signer allows it.
        assert!(
            check_before_signing(&id, &far, NOW, crate::protocol::approval::MAX_LIFETIME_SECS)
                .is_err()
        );
    }

    /// The request of [`request`] and the statement it carries.
    fn with_statement() -> (String, Value, Statement) {
        let (id, r) = request();
        let st = Statement::parse(r["statement"]["text"].as_str().unwrap()).unwrap();
        (id, r, st)
    }

    #[test]
    fn the_statement_is_about_this_request_and_its_tool() {
        let (id, mut r, st) = with_statement();
        assert_eq!(check_approval_and_tool(&id, &st, &r), Ok(()));
        let other = id_at(NOW);
        assert_eq!(
            check_approval_and_tool(&other, &st, &r),
            Err(format!(
                "`approval`: the statement names approval {id}, not {other}"
            ))
        );
        r["tool"] = json!("linux.systemctl_reload");
        assert_eq!(
            check_approval_and_tool(&id, &st, &r),
            Err(
                "`tool`: the statement names `linux.systemctl_restart`, the request shows \"linux.systemctl_reload\""
                    .into()
            )
        );
    }

    #[test]
    fn the_signed_arguments_are_the_ones_shown_and_digested() {
        let (_, r, st) = with_statement();
        assert_eq!(
            signed_args(&st, &r).map(|a| Value::Object(a.clone())),
            Ok(r["statement"]["args"].clone())
        );
        let mut no_statement_args = r.clone();
        no_statement_args["statement"]
            .as_object_mut()
            .unwrap()
            .remove("args");
        assert_eq!(
            signed_args(&st, &no_statement_args).unwrap_err(),
            "`args`: the server sent no arguments for the statement's digest"
        );
        let mut no_args = r.clone();
        no_args["args"] = Value::Null;
        assert_eq!(
            signed_args(&st, &no_args).unwrap_err(),
            "`args`: the request shows no arguments"
        );
        let mut other = r.clone();
        other["args"]["unit"] = json!("nomad");
        assert_eq!(
            signed_args(&st, &other).unwrap_err(),
            "`args`: `unit` is \"consul\" in the statement and \"nomad\" in the request shown"
        );
    }

    #[test]
    fn a_secret_argument_is_shown_sealed_and_any_other_as_signed() {
        let commitment = json!("commit:sha256:".to_owned() + &"e".repeat(64));
        let sealed = json!("hmac-sha256:".to_owned() + &"f".repeat(64));
        assert!(shows_signed_arg(&json!("consul"), Some(&json!("consul"))));
        assert!(shows_signed_arg(&json!(3), Some(&json!(3))));
        assert!(!shows_signed_arg(&json!("consul"), Some(&json!("nomad"))));
        assert!(!shows_signed_arg(&json!("consul"), None));
        assert!(shows_signed_arg(&commitment, Some(&sealed)));
        assert!(!shows_signed_arg(&commitment, Some(&json!("plain"))));
        assert!(!shows_signed_arg(&commitment, None));
        // A value that is no commitment is not matched by a sealed one.
        assert!(!shows_signed_arg(&json!("plain"), Some(&sealed)));
    }

    #[test]
    fn the_statement_names_the_runners_shown_in_any_order() {
        let (_, mut r, st) = with_statement();
        assert_eq!(check_runners(&st, &r), Ok(()));
        r["runners"] = json!(["hvn05", "hvn06"]);
        assert_eq!(check_runners(&st, &r), Ok(()));
        r["runners"] = json!(["hvn05", "hvn07"]);
        assert_eq!(
            check_runners(&st, &r).unwrap_err(),
            "`runner`: the statement names [\"hvn05\", \"hvn06\"], the request shows [\"hvn05\", \"hvn07\"]"
        );
        r["runners"] = Value::Null;
        assert_eq!(
            check_runners(&st, &r).unwrap_err(),
            "`runner`: the request shows no runners"
        );
    }

    #[test]
    fn each_runners_preview_digest_is_of_the_values_it_sealed() {
        let (_, mut r, st) = with_statement();
        assert_eq!(
            preview_lines(&st, &r).unwrap(),
            "  runner   hvn05, preview values {\"restarts\":3,\"state\":\"active\"}\n  runner   hvn06, preview values none\n"
        );
        r["preview"]["hvn05"]["sealed_vars"] = json!("{not json");
        assert_eq!(
            preview_lines(&st, &r).unwrap_err(),
            "`runner hvn05 preview`: the sealed values are not JSON"
        );
        r["preview"]["hvn05"] = json!({});
        assert_eq!(
            preview_lines(&st, &r).unwrap_err(),
            "`runner hvn05 preview`: the statement's digest is not the digest of the preview values shown"
        );
    }

    #[test]
    fn the_signed_rollout_is_the_plan_shown_wave_by_wave() {
        let (_, mut r, st) = with_statement();
        assert_eq!(
            plan_lines(&st, &r).unwrap(),
            "  wave 1   hvn06\n  wave 2   hvn05\n  pause    30 s between waves\n"
        );
        r["plan"]["pause_secs"] = json!(0);
        assert_eq!(
            plan_lines(&st, &r).unwrap_err(),
            r#"`wave`: the statement's rollout is {"pause_secs":30,"waves":[["hvn06"],["hvn05"]]}, the request shows {"pause_secs":0,"waves":[["hvn06"],["hvn05"]]}"#
        );
    }

    #[test]
    fn the_requester_and_the_count_of_people_are_the_ones_shown() {
        let (_, mut r, st) = with_statement();
        assert_eq!(check_requester_and_required(&st, &r), Ok(()));
        r["required_approvals"] = json!(1);
        assert_eq!(
            check_requester_and_required(&st, &r).unwrap_err(),
            "`required`: the statement says 2, the request shows 1"
        );
        r["requester"] = json!("agent:trusted-bot");
        assert_eq!(
            check_requester_and_required(&st, &r).unwrap_err(),
            "`requester`: the statement says `agent:a`, the request shows \"agent:trusted-bot\""
        );
    }
}
