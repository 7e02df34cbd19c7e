//! `emisar audit`: verify the chain, query and export events, check a secret's HMAC.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::DbArg;
use crate::server::audit::{self, AuditFilter};

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Walk the whole hash chain; lists the broken events (the first 20, and how many) and
    /// exits 1 if there is any.
    Verify {
        /// Start at this seq (its predecessor's stored hash is the anchor).
        #[arg(long)]
        since: Option<i64>,
        /// The report as one JSON object instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArg,
    },
    /// The HMAC the audit log stores for a secret value: compare it with a stored event.
    Hash {
        /// The server's audit_key_file.
        #[arg(long)]
        key_file: PathBuf,
        /// The candidate value (read from standard input when left out).
        value: Option<String>,
    },
    /// Print events, oldest first.
    Query {
        #[command(flatten)]
        filter: FilterArgs,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        db: DbArg,
    },
    /// Write every matching event, oldest first, as JSON lines or CSV.
    Export {
        #[command(flatten)]
        filter: FilterArgs,
        #[arg(long, value_parser = ["jsonl", "csv"], default_value = "jsonl")]
        format: String,
        #[command(flatten)]
        db: DbArg,
    },
}

/// The filters `audit query` and `audit export` share with `GET /api/audit`.
#[derive(Args, Clone)]
pub struct FilterArgs {
    #[arg(long)]
    tool: Option<String>,
    #[arg(long)]
    runner: Option<String>,
    #[arg(long)]
    actor: Option<String>,
    #[arg(long)]
    kind: Option<String>,
    #[arg(long)]
    call_id: Option<String>,
    #[arg(long)]
    approval_id: Option<String>,
    #[arg(long)]
    outcome: Option<String>,
    /// RFC 3339 time, e.g. 2026-11-30T00:00:00Z.
    #[arg(long)]
    since: Option<chrono::DateTime<chrono::Utc>>,
    #[arg(long)]
    until: Option<chrono::DateTime<chrono::Utc>>,
}

impl FilterArgs {
    fn into_filter(self, limit: i64) -> AuditFilter {
        AuditFilter {
            tool: self.tool,
            runner: self.runner,
            actor: self.actor,
            kind: self.kind,
            call_id: self.call_id,
            approval_id: self.approval_id,
            outcome: self.outcome,
            since: self.since,
            until: self.until,
            after_seq: None,
            limit,
        }
    }
}

pub async fn run(command: AuditCommand) -> anyhow::Result<i32> {
    match command {
        AuditCommand::Verify { since, json, db } => {
            let db = db.connect().await?;
            let report = audit::verify(&db, since).await?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{}", verify_text(&report));
            }
            Ok(if report.is_intact() { 0 } else { 1 })
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
        } => {
            let db = db.connect().await?;
            let events = audit::query(&db, &filter.into_filter(limit)).await?;
            if !json {
                // `at` is fixed-width RFC 3339 with microseconds: 27 characters.
                println!(
                    "{:>6} {:<27} {:<15} {:<20} {:<22} {:<12} {:<8} reason",
                    "seq", "at", "kind", "actor", "tool", "runner", "outcome"
                );
            }
            for e in &events {
                if json {
                    println!("{}", serde_json::to_string(e)?);
                } else {
                    println!(
                        "{:>6} {} {:<15} {:<20} {:<22} {:<12} {:<8} {}",
                        e.seq,
                        e.at,
                        e.kind,
                        e.actor,
                        e.tool.as_deref().unwrap_or("-"),
                        e.runner.as_deref().unwrap_or("-"),
                        e.outcome.as_deref().unwrap_or("-"),
                        e.reason.as_deref().unwrap_or("")
                    );
                }
            }
            Ok(0)
        }
        AuditCommand::Export { filter, format, db } => {
            use std::io::Write;
            let db = db.connect().await?;
            let mut page = filter.into_filter(1000);
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            if format == "csv" {
                writeln!(out, "{}", CSV_COLUMNS.join(","))?;
            }
            loop {
                let events = audit::query(&db, &page).await?;
                for e in &events {
                    if format == "csv" {
                        writeln!(out, "{}", csv_row(e))?;
                    } else {
                        writeln!(out, "{}", serde_json::to_string(e)?)?;
                    }
                }
                match events.last() {
                    Some(last) if events.len() as i64 == page.limit => {
                        page.after_seq = Some(last.seq)
                    }
                    _ => break,
                }
            }
            out.flush()?;
            Ok(0)
        }
    }
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

const CSV_COLUMNS: [&str; 16] = [
    "seq",
    "id",
    "at",
    "actor",
    "kind",
    "tool",
    "runner",
    "args",
    "reason",
    "call_id",
    "approval_id",
    "outcome",
    "result_digest",
    "detail",
    "prev_hash",
    "hash",
];

/// One event as a CSV row (RFC 4180 quoting; JSON columns as JSON text).
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
        .map(|f| {
            if f.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", f.replace('"', "\"\""))
            } else {
                f.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}
