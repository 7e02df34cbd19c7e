//! `emisar audit`: verify the chain, query and export events, check a secret's HMAC.
//!
//! `query` and `export` read the database when given one (`--database`/`DATABASE_URL`), and
//! otherwise ask a running server's `GET /api/audit` with an auditor's token
//! (`--server`/`EMISAR_SERVER`, `--token`/`EMISAR_TOKEN`). Either way the filters are built
//! by `AuditFilter::from_params`, so both refuse the same input with the same message.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::DbArg;
use crate::server::audit::{self, AuditFilter, AuditParams};

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Walk the whole hash chain; lists the broken events (the first 20, and how many) and
    /// exits 1 if there is any. With --checkpoint, verify only what is new since a checkpoint
    /// you kept, with --witness-key that the witnesses cosigned the newest one, and with
    /// --witness-url that the log holds what each witness cosigned last.
    #[command(
        after_help = "Example: emisar audit verify --checkpoint kept-checkpoint.txt --log-key emisar.example.com/audit+9c1d5e2a+AXyT... --witness-key witness-a.example.org/w1+eba1fbfb+BO/e... --witness-key witness.partner.example.net/w+0a9e71c4+BK... --witness-quorum 2 --witness-url https://witness-a.example.org:7380 --witness-url https://witness.partner.example.net:7380 --database postgres://emisar@db/emisar"
    )]
    Verify {
        /// Start at the first event at or after this RFC 3339 time, e.g.
        /// 2026-11-30T00:00:00Z.
        #[arg(long, conflicts_with = "from_seq")]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Start at this seq (its predecessor's stored hash is the anchor).
        #[arg(long, conflicts_with = "checkpoint")]
        from_seq: Option<i64>,
        /// Verify only what is new since this checkpoint you kept (`emisar audit checkpoint`):
        /// the log must extend it (a consistency proof) and the events since must make the
        /// newest signed checkpoint. Needs --log-key.
        #[arg(
            long,
            value_name = "FILE",
            requires = "log_key",
            conflicts_with = "since"
        )]
        checkpoint: Option<PathBuf>,
        /// The log's verifier key (`name+id+base64`, as `emisar audit log-keygen` printed it),
        /// or a file holding it. Take it from the operator, never from the server you audit.
        #[arg(long, value_name = "KEY")]
        log_key: Option<String>,
        /// A witness you trust: its cosignature verifier key (`name+id+base64`, as `emisar
        /// witness keygen` printed it and emisar.toml's `[[transparency.witnesses]] key` names
        /// it), or a file holding it; once per witness. With it, the newest stored checkpoint
        /// must be cosigned by --witness-quorum of them, or verify fails: the log key alone
        /// signs whatever the database holds, even a log truncated and grown again. Refused:
        /// the log's own key (also re-encoded as a cosignature key), one key given twice.
        #[arg(long = "witness-key", value_name = "KEY", requires = "checkpoint")]
        witness_key: Vec<String>,
        /// How many of the --witness-key witnesses must have cosigned the newest stored
        /// checkpoint, e.g. 2 (default: all of them).
        #[arg(long, value_name = "N", requires = "witness_key")]
        witness_quorum: Option<usize>,
        /// A witness to ask for the latest checkpoint it cosigned (`GET
        /// URL/checkpoint/<origin>` of `emisar witness`), e.g. https://witness-a.example.org:7380;
        /// once per witness, asked before the log is read. Its answer must be signed by
        /// --log-key and cosigned by one --witness-key, which pairs the two by the
        /// cosignature's key name (in any order, for any of the witnesses). Verify fails when
        /// the log holds fewer events than the witness cosigned (truncated) or another tree at
        /// that size (a fork), even if every checkpoint above yours was deleted.
        #[arg(
            long = "witness-url",
            value_name = "URL",
            requires = "witness_key",
            value_parser = witness_url
        )]
        witness_url: Vec<String>,
        /// The report as one JSON object instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArg,
        /// Not offered: only there to say that verify needs the database.
        #[arg(long, hide = true)]
        server: Option<String>,
        /// Not offered, as `--server`.
        #[arg(long, hide = true)]
        token: Option<String>,
    },
    /// Re-verify every executed approval offline: each `approval.executing` must follow
    /// approvals signed over one statement by distinct people of the approvers file, at least
    /// as many as its rule for the tool. Names every failing event; exits 1 if there is any.
    #[command(
        name = "verify-approvals",
        after_help = "Example: emisar audit verify-approvals --approvers /etc/emisar/approvers.toml --database postgres://emisar@db/emisar"
    )]
    VerifyApprovals {
        /// The approvers file the runners trusted (`emisar approvers show`).
        #[arg(long, value_name = "PATH")]
        approvers: PathBuf,
        /// Check only the approvals that began executing at or after this event (`seq`): the
        /// first one after runners began requiring signatures. Earlier ones ran unsigned and
        /// are counted as not checked, never as verified.
        #[arg(long, value_name = "SEQ")]
        from_seq: Option<i64>,
        /// The report as one JSON object instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArg,
    },
    /// List the break-glass windows the audit log shows, oldest first: each one's state
    /// (requested, open, closed-unreviewed, reviewed), who opened and signed it, the calls made
    /// inside it and who reviewed it. Read from the log alone, so a window whose rows were
    /// deleted from the store still shows, unreviewed; a review counts only when its
    /// signatures verify against --approvers (else the window shows why, unreviewed). With
    /// --unreviewed, exits 1 when people still owe a review.
    #[command(
        after_help = "Example: emisar audit break-glass --unreviewed --approvers /etc/emisar/approvers.toml --database postgres://emisar@db/emisar"
    )]
    BreakGlass {
        /// Only the windows people still owe a review.
        #[arg(long)]
        unreviewed: bool,
        /// The approvers file the reviews are checked against (the server's approvers_file,
        /// `emisar approvers show`): required, since a review event without verified
        /// signatures proves nothing.
        #[arg(long, value_name = "FILE")]
        approvers: Option<PathBuf>,
        /// The windows as one JSON object instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArg,
    },
    /// Print the newest signed checkpoint of the audit log with its witnesses' cosignatures:
    /// keep it somewhere the server cannot reach, and verify from it later.
    #[command(
        after_help = "Example: emisar audit checkpoint --cosigned-by 2 --database postgres://emisar@db/emisar > kept-checkpoint.txt"
    )]
    Checkpoint {
        /// The newest checkpoint with at least this many cosignatures.
        #[arg(long, default_value_t = 0)]
        cosigned_by: usize,
        #[command(flatten)]
        db: DbArg,
    },
    /// Print an event with its inclusion proof in the newest checkpoint (JSON); with
    /// --log-key, check it first and exit 1 if it does not verify.
    #[command(
        after_help = "Example: emisar audit prove 0193a6d2-7f1e-7c3a-9b1e-5d2f8a4c6e01 --log-key emisar.example.com/audit+9c1d5e2a+AXyT..."
    )]
    Prove {
        /// The event's id (a UUID, as `audit query` shows it).
        id: String,
        /// A checkpoint with at least this many cosignatures.
        #[arg(long, default_value_t = 0)]
        cosigned_by: usize,
        /// The log's verifier key, or a file holding it: check the proof before printing it.
        #[arg(long, value_name = "KEY")]
        log_key: Option<String>,
        #[command(flatten)]
        db: DbArg,
    },
    /// Make the audit log's signing key for checkpoints (emisar.toml's
    /// `[transparency] log_key_file`); prints its verifier key for auditors and witnesses.
    #[command(
        name = "log-keygen",
        after_help = "Example: emisar audit log-keygen --origin emisar.example.com/audit --key /etc/emisar/log.key"
    )]
    LogKeygen {
        /// The log's origin (the first line of every checkpoint), usually the server's host and
        /// a path, without scheme, spaces or `+`; keep it for the log's life.
        #[arg(long)]
        origin: String,
        /// Where to write the private key (mode 0600; never overwritten).
        #[arg(long)]
        key: PathBuf,
    },
    /// The HMAC the audit log stores for a secret value: compare it with a stored event.
    #[command(
        after_help = "Example: printf '%s' \"$VALUE\" | emisar audit hash --key-file /etc/emisar/audit.key"
    )]
    Hash {
        /// The server's audit_key_file.
        #[arg(long)]
        key_file: PathBuf,
        /// The candidate value (read from standard input when left out).
        value: Option<String>,
    },
    /// Print events, oldest first: from the database, or from a server with an auditor's
    /// token.
    #[command(
        after_help = "Example: emisar audit query --kind tool.rejected --since 2026-11-30T00:00:00Z --server https://emisar.example:7700"
    )]
    Query {
        #[command(flatten)]
        filter: FilterArgs,
        /// The most events to print (1 to 1000).
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArg,
        #[command(flatten)]
        server: AuditorServerArg,
    },
    /// Write every matching event, oldest first, as JSON lines or CSV: from the database, or
    /// from a server with an auditor's token.
    #[command(
        after_help = "Example: emisar audit export --format csv --kind approval.approved > approvals.csv"
    )]
    Export {
        #[command(flatten)]
        filter: FilterArgs,
        /// jsonl (one JSON object per line) or csv (with a header row).
        #[arg(long, value_parser = ["jsonl", "csv"], default_value = "jsonl")]
        format: String,
        #[command(flatten)]
        db: DbArg,
        #[command(flatten)]
        server: AuditorServerArg,
    },
}

/// Where `audit query|export` read when no database is given: a server's `GET /api/audit`,
/// with an auditor's token.
#[derive(Args, Clone)]
pub struct AuditorServerArg {
    /// The server's base URL with its scheme, e.g. https://emisar.example:7700 (or
    /// EMISAR_SERVER); used when no --database is given.
    #[arg(
        long,
        env = "EMISAR_SERVER",
        hide_env_values = true,
        value_parser = super::server_url
    )]
    pub server: Option<String>,
    /// An auditor's API token, from `emisar token issue --agent NAME --role auditor` (or
    /// EMISAR_TOKEN).
    #[arg(long, env = "EMISAR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// The filters `audit query` and `audit export` share with `GET /api/audit`.
#[derive(Args, Clone)]
pub struct FilterArgs {
    /// Events of this tool, e.g. linux.systemctl_restart.
    #[arg(long)]
    tool: Option<String>,
    /// Events on this runner.
    #[arg(long)]
    runner: Option<String>,
    /// Events by this actor, e.g. agent:claude or cli:alice.
    #[arg(long)]
    actor: Option<String>,
    /// Events of this kind, e.g. tool.called, tool.rejected, approval.approved (an unknown
    /// kind is an error that lists them all).
    #[arg(long)]
    kind: Option<String>,
    /// Events of this call.
    #[arg(long)]
    call_id: Option<String>,
    /// Events of this approval request.
    #[arg(long)]
    approval_id: Option<String>,
    /// Events with this outcome: ok, refused or error.
    #[arg(long)]
    outcome: Option<String>,
    /// Events at or after this RFC 3339 time, e.g. 2026-11-30T00:00:00Z.
    #[arg(long)]
    since: Option<String>,
    /// Events before this RFC 3339 time.
    #[arg(long)]
    until: Option<String>,
}

impl FilterArgs {
    fn into_params(self, limit: i64) -> AuditParams {
        AuditParams {
            tool: self.tool,
            runner: self.runner,
            actor: self.actor,
            kind: self.kind,
            call_id: self.call_id,
            approval_id: self.approval_id,
            outcome: self.outcome,
            since: self.since,
            until: self.until,
            cursor: None,
            limit: Some(limit),
        }
    }
}

/// Where `audit query|export` read: the database when one is given, else the server's API.
enum Source {
    Db(crate::server::db::Db),
    Api {
        http: reqwest::Client,
        base: String,
        token: String,
    },
}

impl Source {
    async fn open(db: DbArg, server: AuditorServerArg) -> anyhow::Result<Source> {
        if db.database.is_some() {
            return Ok(Source::Db(db.connect().await?));
        }
        let Some(base) = server.server else {
            anyhow::bail!(
                "no audit log given: pass --database URL (or set DATABASE_URL), or --server URL with an auditor's --token (or EMISAR_SERVER and EMISAR_TOKEN)"
            );
        };
        let token = server.token.context(
            "no token given: pass --token or set EMISAR_TOKEN (an auditor token from `emisar token issue --role auditor`)",
        )?;
        Ok(Source::Api {
            http: reqwest::Client::new(),
            base,
            token,
        })
    }

    /// One page of events after `cursor`.
    async fn page(&self, params: &AuditParams) -> anyhow::Result<Vec<audit::Event>> {
        match self {
            Source::Db(db) => {
                let filter =
                    AuditFilter::from_params(params.clone(), 100).map_err(anyhow::Error::msg)?;
                Ok(audit::query(db, &filter).await?)
            }
            Source::Api { http, base, token } => {
                // The same check the server makes, before the request: the message is then
                // the same for both sources.
                AuditFilter::from_params(params.clone(), 100).map_err(anyhow::Error::msg)?;
                let res = http
                    .get(format!("{base}/api/audit"))
                    .query(params)
                    .bearer_auth(token)
                    .send()
                    .await
                    .with_context(|| format!("failed to reach {base}"))?;
                let status = res.status();
                let body: serde_json::Value = res.json().await.unwrap_or_default();
                if !status.is_success() {
                    anyhow::bail!(
                        "{base}/api/audit: {}",
                        body.get("error")
                            .and_then(|e| e.as_str())
                            .map(str::to_owned)
                            .unwrap_or_else(|| format!("HTTP {status}"))
                    );
                }
                Ok(serde_json::from_value(body["events"].clone())
                    .context("the server's answer holds no events list")?)
            }
        }
    }
}

pub(super) async fn run(command: AuditCommand) -> anyhow::Result<i32> {
    match command {
        AuditCommand::Verify {
            since,
            from_seq,
            checkpoint,
            log_key,
            witness_key,
            witness_quorum,
            witness_url,
            json,
            db,
            server,
            token: _,
        } => {
            let kept = match checkpoint {
                None => None,
                Some(path) => Some(Kept {
                    path,
                    witnesses: witness_quorum_of(log_key.as_deref(), &witness_key, witness_quorum)?,
                    urls: witness_url,
                }),
            };
            verify(since, from_seq, kept, log_key, json, db, server).await
        }
        AuditCommand::VerifyApprovals {
            approvers,
            from_seq,
            json,
            db,
        } => verify_approvals(approvers, from_seq, json, db).await,
        AuditCommand::BreakGlass {
            unreviewed,
            approvers,
            json,
            db,
        } => break_glass(unreviewed, approvers, json, db).await,
        AuditCommand::Checkpoint { cosigned_by, db } => {
            let db = db.connect().await?;
            match audit::checkpoints::latest(&db, cosigned_by).await? {
                Some(cp) => {
                    print!("{}", cp.cosigned());
                    Ok(0)
                }
                None => {
                    eprintln!(
                        "error: no checkpoint{} yet: is [transparency] set in emisar.toml?",
                        if cosigned_by > 0 {
                            format!(" with {cosigned_by} cosignatures")
                        } else {
                            String::new()
                        }
                    );
                    Ok(1)
                }
            }
        }
        AuditCommand::Prove {
            id,
            cosigned_by,
            log_key,
            db,
        } => {
            let db = db.connect().await?;
            let proof = audit::proofs::prove(&db, &id, cosigned_by).await?;
            if let Some(key) = log_key {
                let keys = log_keys(Some(&key))?;
                if let Err(e) = audit::proofs::check_inclusion(&proof, &keys) {
                    eprintln!("FAILED: the proof of event {id} does not verify: {e}");
                    return Ok(1);
                }
            }
            println!("{}", serde_json::to_string_pretty(&proof)?);
            Ok(0)
        }
        AuditCommand::LogKeygen { origin, key } => {
            let vkey = audit::checkpoints::log_keygen(&origin, &key)?;
            println!("wrote {} (keep it secret)", key.display());
            println!("{vkey}");
            Ok(0)
        }
        AuditCommand::Hash { key_file, value } => {
            let key = crate::server::secrets::AuditKey::from_file(&key_file)?;
            let value = match value {
                Some(v) => v,
                None => {
                    let mut line = String::new();
                    std::io::stdin().read_line(&mut line)?;
                    line.trim_end_matches(['\n', '\r']).to_owned()
                }
            };
            println!("{}", key.seal(&value));
            Ok(0)
        }
        AuditCommand::Query {
            filter,
            limit,
            json,
            db,
            server,
        } => query(filter, limit, json, db, server).await,
        AuditCommand::Export {
            filter,
            format,
            db,
            server,
        } => export(filter, format, db, server).await,
    }
}

/// `audit verify --checkpoint`: the kept checkpoint's file, the witnesses to hold the newest
/// stored one to, and those to ask what they cosigned last.
struct Kept {
    path: PathBuf,
    witnesses: Option<audit::proofs::WitnessQuorum>,
    urls: Vec<String>,
}

/// `--witness-url`: a witness's base URL with its scheme.
fn witness_url(value: &str) -> Result<String, String> {
    match reqwest::Url::parse(value) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some() => {
            Ok(value.trim_end_matches('/').to_owned())
        }
        _ => Err(
            "must be the witness's base URL with its scheme, e.g. https://witness-a.example.org:7380"
                .into(),
        ),
    }
}

/// The characters of an origin sent as they are in `GET /checkpoint/<origin>`: RFC 3986's
/// unreserved ones; every other byte, `/` included, is percent-encoded.
const ORIGIN_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Each `--witness-url` witness's latest cosigned checkpoint of `origin`, each answer read up
/// to a limit, with a timeout; a witness that cannot answer is an error naming its URL (verify
/// then says nothing about the log).
async fn ask_witnesses(
    urls: &[String],
    origin: &str,
) -> anyhow::Result<Vec<audit::proofs::WitnessAnswer>> {
    use crate::server::oidc::fetch;
    let http = fetch::client(std::time::Duration::from_secs(10));
    let path = percent_encoding::utf8_percent_encode(origin, ORIGIN_SEGMENT);
    let mut answers = Vec::new();
    for url in urls {
        let at = format!("{url}/checkpoint/{path}");
        let res = http.get(&at).send().await.map_err(|e| {
            anyhow::anyhow!(
                "--witness-url {url}: failed to ask the witness ({at}): {}",
                crate::util::error_chain(&e)
            )
        })?;
        let status = res.status();
        if !status.is_success() {
            let body = fetch::read_limited(&at, res, 4096)
                .await
                .unwrap_or_default();
            anyhow::bail!(
                "--witness-url {url}: {at} answered HTTP {}: {}{}",
                status.as_u16(),
                fetch::excerpt(&body),
                if status == reqwest::StatusCode::NOT_FOUND {
                    " (the witness does not witness this log, has cosigned none of it yet, or is no emisar witness)"
                } else {
                    ""
                }
            );
        }
        let body = fetch::read_limited(&at, res, audit::proofs::MAX_WITNESS_ANSWER_BYTES)
            .await
            .map_err(|e| anyhow::anyhow!("--witness-url {url}: {e}"))?;
        answers.push(audit::proofs::WitnessAnswer {
            url: url.clone(),
            body,
        });
    }
    Ok(answers)
}

/// `--witness-key` (each a key or a file holding one) and `--witness-quorum`, checked against
/// `--log-key` before the database is opened; `None` when no key was given.
fn witness_quorum_of(
    log_key: Option<&str>,
    keys: &[String],
    quorum: Option<usize>,
) -> anyhow::Result<Option<audit::proofs::WitnessQuorum>> {
    if keys.is_empty() {
        return Ok(None);
    }
    // Parsed first, so that a bad --log-key is named as such.
    log_keys(log_key)?;
    let log_key = key_text(log_key.unwrap_or_default(), "--log-key")?;
    let texts = keys
        .iter()
        .map(|k| key_text(k, "--witness-key"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    audit::proofs::WitnessQuorum::new(&log_key, &texts, quorum)
        .map(Some)
        .map_err(anyhow::Error::msg)
}

/// `audit verify`: the whole chain (or from a sequence or a time), or only what came after a
/// kept checkpoint.
async fn verify(
    since: Option<chrono::DateTime<chrono::Utc>>,
    from_seq: Option<i64>,
    checkpoint: Option<Kept>,
    log_key: Option<String>,
    json: bool,
    db: DbArg,
    server: Option<String>,
) -> anyhow::Result<i32> {
    if db.database.is_none() && server.is_some() {
        eprintln!(
            "error: audit verify needs the database (--database or DATABASE_URL): it reads every event and recomputes its hash, which the server's API does not offer; `audit query` and `audit export` work with --server"
        );
        return Ok(2);
    }
    let db = db.connect().await?;
    if let Some(Kept {
        path,
        witnesses,
        urls,
    }) = checkpoint
    {
        let keys = log_keys(log_key.as_deref())?;
        let kept =
            std::fs::read(&path).with_context(|| format!("--checkpoint {}", path.display()))?;
        let answers = if urls.is_empty() {
            Vec::new()
        } else {
            let (_, cp) = crate::tlog::checkpoint::parse(&kept)
                .map_err(|e| anyhow::anyhow!("--checkpoint {}: {e}", path.display()))?;
            ask_witnesses(&urls, cp.origin()).await?
        };
        let report =
            audit::proofs::verify_from(&db, &kept, &keys, witnesses.as_ref(), &answers).await?;
        if json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print!("{}", audit::proofs::report_text(&report));
        }
        return Ok(if report.problem.is_none() { 0 } else { 1 });
    }
    let from_seq = match since {
        None => from_seq,
        Some(since) => {
            let first = audit::query(
                &db,
                &AuditFilter {
                    since: Some(since),
                    limit: 1,
                    ..Default::default()
                },
            )
            .await?;
            match first.first() {
                Some(e) => Some(e.seq),
                None => {
                    println!("ok: no events at or after {since}");
                    return Ok(0);
                }
            }
        }
    };
    let report = audit::verify(&db, from_seq).await?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", verify_text(&report));
    }
    Ok(if report.is_intact() { 0 } else { 1 })
}

/// `audit break-glass`: the windows of the log, their calls and reviews.
async fn break_glass(
    unreviewed: bool,
    approvers: Option<PathBuf>,
    json: bool,
    db: DbArg,
) -> anyhow::Result<i32> {
    let Some(approvers) = approvers else {
        eprintln!(
            "error: audit break-glass needs --approvers FILE (the server's approvers_file): a review counts only when its signatures verify against it, and unverified review events are not trusted"
        );
        return Ok(2);
    };
    let text = std::fs::read_to_string(&approvers)
        .with_context(|| format!("--approvers {}", approvers.display()))?;
    let file = crate::protocol::approval::Approvers::parse(&text)
        .with_context(|| format!("--approvers {}", approvers.display()))?;
    let db = db.connect().await?;
    let now = crate::protocol::signing::now();
    let windows: Vec<_> = crate::server::break_glass::windows_in_log(&db, now, Some(&file))
        .await?
        .into_iter()
        .filter(|w| !unreviewed || w.state.unreviewed())
        .collect();
    if json {
        println!("{}", serde_json::json!({"windows": windows}));
    } else {
        print!("{}", super::break_glass::windows_text(&windows));
    }
    Ok(i32::from(unreviewed && !windows.is_empty()))
}

/// `audit verify-approvals`: every executed approval's signatures against an approvers file.
async fn verify_approvals(
    approvers: PathBuf,
    from_seq: Option<i64>,
    json: bool,
    db: DbArg,
) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(&approvers)
        .with_context(|| format!("--approvers {}", approvers.display()))?;
    let file = crate::protocol::approval::Approvers::parse(&text)
        .with_context(|| format!("--approvers {}", approvers.display()))?;
    let db = db.connect().await?;
    let mut events = Vec::new();
    for kind in [
        audit::kind::APPROVAL_REQUESTED,
        audit::kind::APPROVAL_APPROVED,
        audit::kind::APPROVAL_EXECUTING,
        audit::kind::ROLLOUT_DECIDED,
    ] {
        let mut after_seq = None;
        loop {
            let page = audit::query(
                &db,
                &AuditFilter {
                    kind: Some(kind.into()),
                    after_seq,
                    limit: audit::MAX_PAGE,
                    ..Default::default()
                },
            )
            .await?;
            let Some(last) = page.last() else { break };
            after_seq = Some(last.seq);
            events.extend(page);
        }
    }
    // Votes are kept whatever their seq (they come before their execution); executions
    // before `from_seq` are set aside and counted.
    let before = |e: &audit::Event| {
        e.kind == audit::kind::APPROVAL_EXECUTING && from_seq.is_some_and(|from| e.seq < from)
    };
    let not_checked = events.iter().filter(|e| before(e)).count();
    events.retain(|e| !before(e));
    let mut report = audit::signed::verify(&events, &file);
    report.not_checked = not_checked as u64;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for f in &report.failures {
            println!(
                "FAILED approval {}: event seq {} ({}): {}",
                f.approval_id, f.seq, f.event_id, f.why
            );
        }
        println!(
            "{}: {} executed approvals and {} rollout decisions verified against {} (sha256:{}), {} failed{}",
            if report.failures.is_empty() {
                "ok"
            } else {
                "FAILED"
            },
            report.verified,
            report.decisions_verified,
            approvers.display(),
            file.sha256,
            report.failures.len(),
            match from_seq {
                Some(from) => format!(", {not_checked} before seq {from} not checked"),
                None => String::new(),
            }
        );
    }
    Ok(if report.failures.is_empty() { 0 } else { 1 })
}

/// `audit query`: one page of events, as a table or JSON lines.
async fn query(
    filter: FilterArgs,
    limit: i64,
    json: bool,
    db: DbArg,
    server: AuditorServerArg,
) -> anyhow::Result<i32> {
    let params = filter.into_params(limit);
    let source = Source::open(db, server).await?;
    let events = source.page(&params).await?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if !json {
        // `at` is fixed-width RFC 3339 with microseconds: 27 characters.
        writeln!(
            out,
            "{:>6} {:<27} {:<15} {:<20} {:<22} {:<12} {:<8} reason",
            "seq", "at", "kind", "actor", "tool", "runner", "outcome"
        )?;
    }
    for e in &events {
        if json {
            writeln!(out, "{}", serde_json::to_string(e)?)?;
        } else {
            writeln!(
                out,
                "{:>6} {} {:<15} {:<20} {:<22} {:<12} {:<8} {}",
                e.seq,
                e.at,
                e.kind,
                e.actor,
                e.tool.as_deref().unwrap_or("-"),
                e.runner.as_deref().unwrap_or("-"),
                e.outcome.as_deref().unwrap_or("-"),
                e.reason.as_deref().unwrap_or("")
            )?;
        }
    }
    out.flush()?;
    Ok(0)
}

/// `audit export`: every event the filters match, page after page, as JSON lines or CSV.
async fn export(
    filter: FilterArgs,
    format: String,
    db: DbArg,
    server: AuditorServerArg,
) -> anyhow::Result<i32> {
    let mut params = filter.into_params(audit::MAX_PAGE);
    let source = Source::open(db, server).await?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if format == "csv" {
        writeln!(out, "{}", csv_columns().collect::<Vec<_>>().join(","))?;
    }
    loop {
        let events = source.page(&params).await?;
        for e in &events {
            if format == "csv" {
                writeln!(out, "{}", csv_row(e))?;
            } else {
                writeln!(out, "{}", serde_json::to_string(e)?)?;
            }
        }
        match events.last() {
            Some(last) if events.len() as i64 == audit::MAX_PAGE => {
                params.cursor = Some(last.seq.to_string())
            }
            _ => break,
        }
    }
    out.flush()?;
    Ok(0)
}

/// The report of `audit verify` as text: one line for the verdict, then one per listed event.
fn verify_text(r: &audit::VerifyReport) -> String {
    use std::fmt::Write;
    let range = match (r.first_seq, r.last_seq) {
        (Some(a), Some(b)) => format!("seq {a}..{b}"),
        _ => "no events".to_owned(),
    };
    let mut out = String::new();
    if r.is_intact() {
        let _ = writeln!(out, "ok: {} events verified ({range})", r.checked);
    } else {
        let _ = writeln!(
            out,
            "BROKEN: {} of {} events checked ({range}) are broken",
            r.broken_count, r.checked
        );
        for b in &r.broken {
            let _ = writeln!(out, "BROKEN at seq {}: {}", b.seq, b.problem);
        }
        if r.broken_count > r.broken.len() as u64 {
            let _ = writeln!(
                out,
                "... and {} more broken events not listed",
                r.broken_count - r.broken.len() as u64
            );
        }
    }
    for w in &r.warnings {
        let _ = writeln!(out, "warning at seq {}: {}", w.seq, w.problem);
    }
    if r.warning_count > r.warnings.len() as u64 {
        let _ = writeln!(
            out,
            "... and {} more warnings not listed",
            r.warning_count - r.warnings.len() as u64
        );
    }
    out
}

/// The columns `audit export` writes as CSV: every stored column but `hash_v`, how the hash
/// input was built, which is the verifier's business and not the auditor's. [`csv_row`]
/// writes them in this order.
fn csv_columns() -> impl Iterator<Item = &'static str> {
    audit::COLUMNS.into_iter().filter(|c| *c != "hash_v")
}

/// One event as a CSV row (RFC 4180 quoting; JSON columns as JSON text; every cell through
/// [`csv_cell`]).
fn csv_row(e: &audit::Event) -> String {
    let text = |o: &Option<String>| o.clone().unwrap_or_default();
    let json =
        |o: &Option<serde_json::Value>| o.as_ref().map(|v| v.to_string()).unwrap_or_default();
    let fields = [
        e.seq.to_string(),
        e.id.clone(),
        e.at.clone(),
        e.actor.clone(),
        e.kind.clone(),
        text(&e.tool),
        text(&e.runner),
        json(&e.args),
        text(&e.reason),
        text(&e.call_id),
        text(&e.approval_id),
        text(&e.outcome),
        text(&e.result_digest),
        json(&e.detail),
        e.prev_hash.clone(),
        e.hash.clone(),
    ];
    fields
        .iter()
        .map(|f| csv_cell(f))
        .collect::<Vec<_>>()
        .join(",")
}

/// The first characters with which a spreadsheet reads a cell as a formula (OWASP, "CSV
/// Injection"): `=`, `+`, `-`, `@`, tab and carriage return.
const FORMULA_STARTS: [char; 6] = ['=', '+', '-', '@', '\t', '\r'];

/// One CSV cell. Reasons, arguments and names come from agents and people, and an auditor
/// opens the export in a spreadsheet: a cell that would start a formula (`=HYPERLINK(…)`)
/// is prefixed with a single quote, which makes it text, and quoted. Other cells are quoted
/// as RFC 4180 says, only when they hold a separator, a quote or a line break.
fn csv_cell(f: &str) -> String {
    if f.starts_with(FORMULA_STARTS) {
        format!("\"'{}\"", f.replace('"', "\"\""))
    } else if f.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", f.replace('"', "\"\""))
    } else {
        f.to_owned()
    }
}

/// The log's verifier key from `--log-key`: the key text itself, or a file holding it.
fn log_keys(arg: Option<&str>) -> anyhow::Result<crate::tlog::keys::Verifiers> {
    let arg = arg.context("--log-key: give the log's verifier key (name+id+base64)")?;
    let text = key_text(arg, "--log-key")?;
    crate::tlog::keys::Verifiers::parse([text.as_str()])
        .map_err(|e| anyhow::anyhow!("--log-key: {e}"))
}

/// A verifier key given as its text or as a file holding it (for `option`'s messages).
fn key_text(arg: &str, option: &str) -> anyhow::Result<String> {
    let text = if std::path::Path::new(arg).is_file() {
        std::fs::read_to_string(arg).with_context(|| format!("{option} {arg}"))?
    } else {
        arg.to_owned()
    };
    Ok(text.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_cells_that_would_start_a_formula_become_quoted_text() {
        for (cell, want) in [
            (
                "=HYPERLINK(\"https://evil.example\",\"x\")",
                "\"'=HYPERLINK(\"\"https://evil.example\"\",\"\"x\"\")\"",
            ),
            ("+1+1", "\"'+1+1\""),
            ("-2+3", "\"'-2+3\""),
            ("@SUM(A1)", "\"'@SUM(A1)\""),
            ("\t=1", "\"'\t=1\""),
            ("\r=1", "\"'\r=1\""),
        ] {
            assert_eq!(csv_cell(cell), want, "{cell:?}");
        }
        // Cells that start a formula nowhere but the front are left as RFC 4180 has them.
        assert_eq!(csv_cell("a=b"), "a=b");
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
        assert_eq!(csv_cell("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_cell(""), "");
    }
}
