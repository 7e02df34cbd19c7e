//! Checkpoints of the audit tree and their witnesses: every `checkpoint_interval_ms`, or
//! sooner once `checkpoint_every_events` events were appended, the tree's size and root are
//! signed with the log key as a C2SP `tlog-checkpoint` (a signed note), stored, and submitted
//! to every configured witness by the C2SP `tlog-witness` protocol with a consistency proof
//! from the size that witness cosigned last. Each cosignature is verified against the
//! witness's configured key before it is stored; a checkpoint is *witnessed* once
//! `witness_quorum` witnesses cosigned it.
//!
//! A witness that refuses (a split view, a tree that does not extend what it cosigned, a bad
//! signature) is reported loudly: an ERROR log line, the metric
//! `emisar_witness_refusals_total`, and a `witness.refused` audit event (repeats counted per
//! window, `refusals.rs`). So is a witness that has cosigned a larger tree than the log now
//! holds (as stored, or as its 409 says): events it saw are gone from the database.
//! It is reported at the first round that sees it, not once the log has grown back past that
//! size, and it never counts as cosigned.
//!
//! Invariants: the log key signs only a size and root read from the stored tree, after the
//! events they cover committed; it never signs a tree this process computed alone. A witness
//! counts towards the quorum of a size only with a verified cosignature of that size.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::chain::{NewEvent, kind};
use super::refusals::RefusalKey;
use super::tree;
use super::writer::AuditLog;
use crate::server::db::Db;
use crate::tlog::checkpoint;
use crate::tlog::keys::{NoteKey, Verifiers};

/// `[transparency]`: the audit log as a transparency log with signed checkpoints and
/// witnesses. The Merkle tree is kept whether or not this is set; without it nothing is
/// signed.
#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransparencyConfig {
    /// The log's signed-note private key (`emisar audit log-keygen`), e.g.
    /// `/etc/emisar/log.key`; its name is the checkpoints' origin. Not the server's call
    /// signing key.
    pub log_key_file: PathBuf,
    /// The longest time between checkpoints while events are appended, in milliseconds.
    #[serde(default = "default_interval_ms")]
    pub checkpoint_interval_ms: u64,
    /// A checkpoint is made as soon as this many events were appended since the last one.
    #[serde(default = "default_every")]
    pub checkpoint_every_events: u64,
    /// The witnesses each checkpoint is submitted to: one `[[transparency.witnesses]]` each.
    #[serde(default)]
    pub witnesses: Vec<WitnessEntry>,
    /// How many witnesses must cosign a checkpoint for it to count as witnessed, e.g. `2`
    /// (default: all of them).
    #[serde(default)]
    pub witness_quorum: Option<usize>,
}

/// One witness (`emisar witness`, or any C2SP tlog-witness).
#[derive(schemars::JsonSchema, Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WitnessEntry {
    /// The witness's submission prefix, e.g. `https://witness.example.org` (requests go to
    /// `URL/add-checkpoint`).
    pub url: String,
    /// The witness's cosignature verifier key (`name+id+base64`, as `emisar witness keygen`
    /// prints it).
    pub key: String,
}

fn default_interval_ms() -> u64 {
    1000
}
fn default_every() -> u64 {
    1000
}

impl TransparencyConfig {
    /// Refuses what cannot work, naming the field.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        if self.checkpoint_interval_ms == 0 || self.checkpoint_every_events == 0 {
            anyhow::bail!(
                "transparency.checkpoint_interval_ms and checkpoint_every_events must be at least 1"
            );
        }
        for (i, w) in self.witnesses.iter().enumerate() {
            crate::tlog::cosignature::CosignatureVerifier::from_verifier_key(&w.key)
                .map_err(|e| anyhow::anyhow!("transparency.witnesses[{i}].key: {e}"))?;
            let url = reqwest::Url::parse(&w.url)
                .map_err(|e| anyhow::anyhow!("transparency.witnesses[{i}].url: {e}"))?;
            if !matches!(url.scheme(), "http" | "https") {
                anyhow::bail!("transparency.witnesses[{i}].url: must be http:// or https://");
            }
        }
        if let Some(q) = self.witness_quorum
            && (q == 0 || q > self.witnesses.len())
        {
            anyhow::bail!(
                "transparency.witness_quorum: {q} must be between 1 and the {} witnesses listed",
                self.witnesses.len()
            );
        }
        Ok(())
    }
}

impl TransparencyConfig {
    /// The witnesses against the log's own key, by the rule runners apply to theirs
    /// (`tlog::keys::check_witnesses`): distinct cosignature keys, none the log key.
    pub(crate) fn check_witness_keys(&self, log: &NoteKey) -> anyhow::Result<()> {
        if self.witnesses.is_empty() {
            return Ok(());
        }
        let keys: Vec<&str> = self.witnesses.iter().map(|w| w.key.as_str()).collect();
        crate::tlog::keys::check_witnesses(
            &log.verifier_key(),
            "transparency.witnesses",
            &keys,
            self.witness_quorum.unwrap_or(keys.len()),
            "transparency.witness_quorum",
        )
        .map_err(|e| anyhow::anyhow!("{}", e.0))
    }
}

/// Reads the log key (refused when others may read it).
pub(crate) fn read_log_key(path: &std::path::Path) -> anyhow::Result<NoteKey> {
    let text = crate::util::files::read_private(path, "the audit log's")?;
    NoteKey::parse(&text).with_context(|| format!("{} is not a signed-note key", path.display()))
}

/// `emisar audit log-keygen`: a new log key named `origin` in `path` (mode 0600, never
/// overwriting); returns its verifier key, for auditors, witnesses and runners.
pub fn log_keygen(origin: &str, path: &std::path::Path) -> anyhow::Result<String> {
    let key = NoteKey::generate(origin).map_err(|e| anyhow::anyhow!("--origin: {e}"))?;
    crate::util::files::create_private(path, format!("{}\n", key.private_text()).as_bytes())?;
    Ok(key.verifier_key())
}

/// The latest checkpoint, with the cosignature lines stored for it.
#[derive(Debug, Clone)]
pub struct Stored {
    pub size: u64,
    /// The signed note as the log key signed it.
    pub note: String,
    /// `— name base64` lines of witnesses, each verified when it arrived.
    pub cosignatures: Vec<String>,
}

impl Stored {
    /// The note with every cosignature appended: what an auditor keeps and a runner checks.
    pub(crate) fn cosigned(&self) -> String {
        let mut text = self.note.clone();
        for line in &self.cosignatures {
            text.push_str(line);
            text.push('\n');
        }
        text
    }
}

/// The latest stored checkpoint (with at least `min_cosigned` cosignatures, when given).
pub async fn latest(db: &Db, min_cosigned: usize) -> Result<Option<Stored>, sqlx::Error> {
    let sql = db.sql(format!(
        "SELECT c.size, c.note FROM audit_checkpoints c \
         WHERE (SELECT COUNT(*) FROM audit_cosignatures s WHERE s.size = c.size) >= {min_cosigned} \
         ORDER BY c.size DESC LIMIT 1"
    ));
    let row: Option<(i64, String)> = db
        .guard(async {
            crate::with_pool!(db, pool => sqlx::query_as(sql).fetch_optional(pool).await)
        })
        .await?;
    let Some((size, note)) = row else {
        return Ok(None);
    };
    let cosignatures: Vec<String> = db
        .guard(async {
            crate::with_pool!(db, pool => sqlx::query_scalar(
                "SELECT line FROM audit_cosignatures WHERE size = $1 ORDER BY witness")
                .bind(size).fetch_all(pool).await)
        })
        .await?;
    Ok(Some(Stored {
        size: size as u64,
        note,
        cosignatures,
    }))
}

/// Every stored checkpoint's size and note, oldest first (for `audit verify --checkpoint`).
pub(crate) async fn all(db: &Db) -> Result<Vec<(u64, String)>, sqlx::Error> {
    let rows: Vec<(i64, String)> = db
        .guard(async {
            crate::with_pool!(db, pool => sqlx::query_as(
                "SELECT size, note FROM audit_checkpoints ORDER BY size").fetch_all(pool).await)
        })
        .await?;
    Ok(rows.into_iter().map(|(s, n)| (s as u64, n)).collect())
}

async fn store_checkpoint(db: &Db, size: u64, note: &str) -> Result<(), sqlx::Error> {
    db.guard(async {
        crate::with_pool!(db, pool => sqlx::query(
            "INSERT INTO audit_checkpoints (size, note) VALUES ($1, $2) ON CONFLICT (size) DO NOTHING")
            .bind(size as i64).bind(note).execute(pool).await.map(|_| ()))
    })
    .await?;
    Ok(())
}

async fn store_cosignature(
    db: &Db,
    size: u64,
    witness: &str,
    line: &str,
) -> Result<(), sqlx::Error> {
    db.guard(async {
        crate::with_pool!(db, pool => sqlx::query(
            "INSERT INTO audit_cosignatures (size, witness, line) VALUES ($1, $2, $3) \
             ON CONFLICT (size, witness) DO NOTHING")
            .bind(size as i64).bind(witness).bind(line).execute(pool).await.map(|_| ()))
    })
    .await?;
    Ok(())
}

/// The size a witness cosigned last, as stored (0 when never).
async fn cosigned_size(db: &Db, witness: &str) -> Result<u64, sqlx::Error> {
    let size: Option<i64> = db
        .guard(async {
            crate::with_pool!(db, pool => sqlx::query_scalar(
                "SELECT MAX(size) FROM audit_cosignatures WHERE witness = $1")
                .bind(witness).fetch_one(pool).await)
        })
        .await?;
    Ok(size.unwrap_or(0) as u64)
}

/// One configured witness, as the server talks to it.
struct Witness {
    url: String,
    /// The key's name: how its cosignature lines and stored rows are named.
    name: String,
    key: String,
    /// The size it cosigned last, once known.
    size: Option<u64>,
}

/// What became of a submission that was not refused.
#[derive(Debug, PartialEq)]
enum Submitted {
    /// The witness cosigned this size; the cosignature is verified and stored.
    Cosigned,
    /// The witness had already cosigned a larger tree that the log holds too: another
    /// replica's checkpoint got there first, and the next round submits the log's new size.
    /// Not a cosignature of this size.
    Overtaken,
}

/// Why a witness did not cosign.
#[derive(Debug)]
enum Refusal {
    /// It answered a status other than 200 (after one retry on 409).
    Status(u16, String),
    /// It could not be reached, or answered something that is not a valid cosignature.
    Failed(String),
    /// It has cosigned `witness_size` events (as stored, or as its 409 said), more than the
    /// `log_size` the log holds now: events it saw were removed.
    Truncated {
        witness_size: u64,
        log_size: u64,
        /// Its answer, when the size came from a 409.
        answer: Option<String>,
    },
}

/// The checkpointer task's state.
pub struct Checkpointer {
    db: Db,
    audit: AuditLog,
    key: NoteKey,
    interval: Duration,
    every: u64,
    quorum: usize,
    witnesses: Vec<Witness>,
    http: reqwest::Client,
    last_size: u64,
}

impl Checkpointer {
    pub fn new(db: Db, audit: AuditLog, config: &TransparencyConfig) -> anyhow::Result<Self> {
        config.check()?;
        let key = read_log_key(&config.log_key_file)?;
        config.check_witness_keys(&key)?;
        let witnesses = config
            .witnesses
            .iter()
            .map(|w| Witness {
                url: w.url.trim_end_matches('/').to_owned(),
                name: w.key.split('+').next().unwrap_or_default().to_owned(),
                key: w.key.clone(),
                size: None,
            })
            .collect::<Vec<_>>();
        Ok(Checkpointer {
            db,
            audit,
            key,
            interval: Duration::from_millis(config.checkpoint_interval_ms),
            every: config.checkpoint_every_events,
            quorum: config.witness_quorum.unwrap_or(witnesses.len()),
            witnesses,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()?,
            last_size: 0,
        })
    }

    /// The log's verifier key (for auditors, witnesses and runners).
    pub(crate) fn verifier_key(&self) -> String {
        self.key.verifier_key()
    }

    /// Runs until `shutdown`: a checkpoint every interval, or sooner when `every` events
    /// were appended.
    pub(crate) fn spawn(mut self, mut appended: watch::Receiver<i64>, shutdown: CancellationToken) {
        tokio::spawn(async move {
            loop {
                let due = self.last_size + self.every;
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(self.interval) => {}
                    _ = appended.wait_for(|&seq| seq as u64 >= due) => {}
                }
                if let Err(e) = self.tick().await {
                    tracing::warn!(error = %e, "failed to make a checkpoint of the audit log");
                }
            }
        });
    }

    /// Makes a checkpoint of the stored tree if it grew, and submits it to the witnesses that
    /// do not have it. Returns the size checkpointed.
    pub async fn tick(&mut self) -> anyhow::Result<u64> {
        let size = tree::size(&self.db).await?;
        let behind = self.witnesses.iter().any(|w| w.size != Some(size));
        if size == self.last_size && !behind {
            return Ok(size);
        }
        let root = tree::root(&self.db, size).await?;
        let note = checkpoint::sign(self.key.name(), size, root, "", &self.key)?;
        let note = String::from_utf8(note).context("a signed note is UTF-8")?;
        store_checkpoint(&self.db, size, &note).await?;
        self.last_size = size;
        crate::server::metrics::checkpoint_made(size);
        let mut cosigned = 0;
        for i in 0..self.witnesses.len() {
            if self.witnesses[i].size == Some(size) {
                cosigned += 1;
                continue;
            }
            match self.submit(i, size, &note).await {
                Ok(Submitted::Cosigned) => cosigned += 1,
                Ok(Submitted::Overtaken) => {}
                Err(refusal) => self.report(i, size, refusal).await,
            }
        }
        if !self.witnesses.is_empty() && cosigned >= self.quorum {
            crate::server::metrics::checkpoint_witnessed(size);
        }
        Ok(size)
    }

    /// Submits the checkpoint of `size` to witness `i`, with a consistency proof from the size
    /// it cosigned last; on 409 learns its size and tries once more.
    async fn submit(&mut self, i: usize, size: u64, note: &str) -> Result<Submitted, Refusal> {
        let failed = |e: &dyn std::fmt::Display| Refusal::Failed(e.to_string());
        let mut old = match self.witnesses[i].size {
            Some(s) => s,
            None => cosigned_size(&self.db, &self.witnesses[i].name)
                .await
                .map_err(|e| failed(&e))?,
        };
        let mut conflict = None;
        for _ in 0..2 {
            if old > size {
                self.witnesses[i].size = Some(old);
                return self.ahead(old, conflict).await;
            }
            let proof = tree::consistency_proof(&self.db, old, size)
                .await
                .map_err(|e| failed(&e))?;
            let mut body = format!("old {old}\n");
            for h in &proof {
                body.push_str(&h.to_string());
                body.push('\n');
            }
            body.push('\n');
            body.push_str(note);
            let w = &self.witnesses[i];
            let answer = self
                .http
                .post(format!("{}/add-checkpoint", w.url))
                .body(body)
                .send()
                .await
                .map_err(|e| failed(&e))?;
            let status = answer.status().as_u16();
            let text = answer.text().await.map_err(|e| failed(&e))?;
            match status {
                200 => {
                    let line = self.check_cosignature(i, note, &text)?;
                    store_cosignature(&self.db, size, &self.witnesses[i].name, &line)
                        .await
                        .map_err(|e| failed(&e))?;
                    self.witnesses[i].size = Some(size);
                    return Ok(Submitted::Cosigned);
                }
                409 => {
                    old = text.trim_end().parse().map_err(|_| {
                        Refusal::Status(409, format!("a 409 without a size: {text:?}"))
                    })?;
                    self.witnesses[i].size = Some(old);
                    conflict = Some(text);
                }
                _ => return Err(Refusal::Status(status, text)),
            }
        }
        Err(Refusal::Status(
            409,
            "the witness's size changed again between two submissions".into(),
        ))
    }

    /// A witness has cosigned `witness_size` events, more than the checkpoint this round made.
    /// If the log holds that many now, another replica's checkpoint got there first; if it
    /// holds fewer, events the witness saw are gone: a refusal, whatever the log's size when
    /// it grows back.
    async fn ahead(&self, witness_size: u64, answer: Option<String>) -> Result<Submitted, Refusal> {
        let log_size = tree::size(&self.db)
            .await
            .map_err(|e| Refusal::Failed(e.to_string()))?;
        if log_size >= witness_size {
            Ok(Submitted::Overtaken)
        } else {
            Err(Refusal::Truncated {
                witness_size,
                log_size,
                answer,
            })
        }
    }

    /// The cosignature line of witness `i` in its answer, verified over `note`'s text.
    fn check_cosignature(&self, i: usize, note: &str, answer: &str) -> Result<String, Refusal> {
        let w = &self.witnesses[i];
        let keys = Verifiers::parse([w.key.as_str()])
            .map_err(|e| Refusal::Failed(format!("witness key: {e}")))?;
        for line in answer.lines().filter(|l| !l.is_empty()) {
            let merged = format!("{note}{line}\n");
            let Ok((parsed, _)) = checkpoint::parse(merged.as_bytes()) else {
                continue;
            };
            if checkpoint::verify(&parsed, &keys).is_ok()
                && line.starts_with(&format!("— {} ", w.name))
            {
                return Ok(line.to_owned());
            }
        }
        Err(Refusal::Failed(format!(
            "the answer holds no valid cosignature by {}: {answer:?}",
            w.key
        )))
    }

    /// A witness refused: an ERROR line, a metric, and an audit event (repeats counted).
    async fn report(&self, i: usize, size: u64, refusal: Refusal) {
        let w = &self.witnesses[i];
        let (status, why, class) = match &refusal {
            Refusal::Status(s, body) => (
                Some(*s),
                body.trim().to_owned(),
                match s {
                    422 => "inconsistent",
                    403 => "signature",
                    409 => "conflict",
                    _ => "status",
                },
            ),
            Refusal::Failed(e) => (None, e.clone(), "unreachable"),
            Refusal::Truncated {
                witness_size,
                log_size,
                answer,
            } => (
                answer.as_ref().map(|_| 409),
                format!(
                    "the witness has cosigned {witness_size} events, the log holds {log_size}: truncated"
                ),
                "truncated",
            ),
        };
        let mut detail = json!({
            "witness": w.name,
            "url": w.url,
            "size": size,
            "status": status,
            "answer": why.chars().take(512).collect::<String>(),
        });
        if let Refusal::Truncated {
            witness_size,
            log_size,
            ..
        } = &refusal
        {
            tracing::error!(
                witness = %w.url, witness_size, log_size, size, ?status,
                "a witness has cosigned more of the audit log than the database holds: \
                 events it saw were deleted (the log was truncated)"
            );
            detail["witness_size"] = json!(witness_size);
            detail["log_size"] = json!(log_size);
            crate::server::metrics::witness_refused(&w.name, "truncated");
        } else {
            let split_view = matches!(status, Some(422) | Some(403) | Some(409));
            tracing::error!(
                witness = %w.url, size, ?status, why = %why, split_view,
                "a witness refused the audit log's checkpoint"
            );
            let status = status.map_or_else(|| "unreachable".to_owned(), |s| s.to_string());
            crate::server::metrics::witness_refused(&w.name, &status);
        }
        let event = NewEvent {
            actor: "system:checkpoints".into(),
            kind: kind::WITNESS_REFUSED.into(),
            outcome: Some("refused".into()),
            detail: Some(detail),
            ..Default::default()
        };
        let key = RefusalKey {
            kind: kind::WITNESS_REFUSED,
            caller: w.name.clone(),
            class,
        };
        if let Err(e) = self.audit.refused(key, event).await {
            tracing::error!(error = %e, "failed to audit a witness's refusal");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_witnesses_follow_the_runners_rule() {
        let log = NoteKey::generate("emisar.test/audit").unwrap();
        let w = NoteKey::generate("witness.test/w1").unwrap();
        let config = |keys: &[String], quorum| TransparencyConfig {
            log_key_file: "/dev/null".into(),
            checkpoint_interval_ms: 1000,
            checkpoint_every_events: 10,
            witnesses: keys
                .iter()
                .map(|k| WitnessEntry {
                    url: "http://127.0.0.1:9".into(),
                    key: k.clone(),
                })
                .collect(),
            witness_quorum: quorum,
        };
        let refused = |keys: &[String], quorum| {
            format!(
                "{:#}",
                config(keys, quorum).check_witness_keys(&log).unwrap_err()
            )
        };
        config(&[w.cosigner_key()], None)
            .check_witness_keys(&log)
            .unwrap();
        config(&[], None).check_witness_keys(&log).unwrap();
        let own = refused(&[log.cosigner_key()], None);
        assert!(
            own.contains("transparency.witnesses[0]") && own.contains("log's own key"),
            "{own}"
        );
        let twice = refused(&[w.cosigner_key(), w.cosigner_key()], Some(2));
        assert!(
            twice.contains("transparency.witnesses[1]") && twice.contains("counts once"),
            "{twice}"
        );
    }
}
