//! What an auditor checks against the log's signed checkpoints: an event's inclusion proof
//! (`emisar audit prove`, `GET /api/audit/proof`), and the log's growth since a checkpoint the
//! auditor kept (`emisar audit verify --checkpoint`), at a cost that follows what is new.
//!
//! Verifying from a kept checkpoint of size `n` to the newest signed one of size `N`:
//! 1. both checkpoints verify with the log's key (the auditor's copy of it, never the
//!    server's word);
//! 2. the stored tree's consistency proof from `n` to `N` verifies (RFC 9162 §2.1.4.2): the
//!    log as stored extends what the auditor saw;
//! 3. event `n`'s stored hash is leaf `n - 1` of the kept tree (an inclusion proof), so the
//!    chain is anchored in what the checkpoint committed to;
//! 4. events `n + 1 ..= N` are read, each one's hash recomputed from its fields and linked to
//!    the one before, and their leaves appended to the kept tree's right edge: the result must
//!    be the newest checkpoint's root. Events after `N` are chain-checked only, and counted.
//!
//! Before step 1's newest checkpoint is read, the log must hold at least the `n` events of the
//! kept one (else it was truncated). After step 4, given the witnesses' keys
//! (`--witness-key`), the newest stored checkpoint must be cosigned by a quorum of them: the
//! log key alone signs whatever the database holds, so a log truncated back to the kept size,
//! or truncated and grown again with other events, passes steps 1 to 4; only the witnesses
//! saw the larger tree, and they cosign nothing that does not extend it.
//!
//! Nor does that catch a log cut back to the kept size while no checkpointer runs (the newest
//! stored checkpoint is then the kept one, cosigned). So each witness the auditor names by URL
//! (`--witness-url`) is asked for the latest checkpoint it cosigned, before the log is read
//! (`GET /checkpoint/<origin>` of `emisar witness`): it must carry the log key's signature and
//! the cosignature of one `--witness-key`; a size above the events the log holds fails verify
//! (truncated), and the log's tree at that size must have the witness's root: from the events'
//! recomputed hashes above `n` (grown with step 4), by the stored tree's consistency proof to
//! the kept checkpoint at or below it; another root fails verify (a fork).
//!
//! When step 2 or 3 fails, history the auditor saw was rewritten. The whole log up to `n` is
//! then rebuilt from its events and compared with every checkpoint the log key signed (the
//! stored ones that still verify, and the kept one), which names the first event that differs
//! from what the key signed, or the narrowest range of events it lies in.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Serialize;
use tlog_tiles::Hash;

use super::chain::{Anchor, Event, kind};
use super::checkpoints;
use super::store::{AuditFilter, query};
use super::tree;
use super::verify;
use crate::protocol::witnessed::{event_leaf, proof_hashes};
use crate::server::db::Db;
use crate::tlog::checkpoint::{self, Checkpoint};
use crate::tlog::keys::Verifiers;
use crate::tlog::tree::{Frontier, verify_consistency, verify_inclusion};

/// The most bytes of a witness's answer to `GET /checkpoint/<origin>` read: a checkpoint with
/// its signatures is a few hundred.
pub const MAX_WITNESS_ANSWER_BYTES: usize = 64 * 1024;

/// Events read per query while verifying.
const PAGE: i64 = 10_000;

/// An event with its inclusion proof in a signed checkpoint.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct InclusionProof {
    pub event: Event,
    /// The event's leaf: `seq - 1`.
    pub leaf_index: u64,
    /// The checkpoint (signed note, with its cosignatures) the proof is against.
    pub checkpoint: String,
    /// The audit path, base64 hashes, leaf to root (RFC 9162 §2.1.3.1).
    pub proof: Vec<String>,
}

/// The inclusion proof of event `id` (its UUID) in the newest checkpoint that covers it, with
/// at least `min_cosigned` cosignatures; an error when there is no such event or no such
/// checkpoint covers it yet.
pub async fn prove(db: &Db, id: &str, min_cosigned: usize) -> anyhow::Result<InclusionProof> {
    let seq: Option<i64> = db
        .guard(async {
            crate::with_pool!(db, pool => sqlx::query_scalar(
                "SELECT seq FROM audit_events WHERE id = $1").bind(id).fetch_optional(pool).await)
        })
        .await?;
    let seq = seq.ok_or_else(|| anyhow::anyhow!("no event has the id `{id}`"))?;
    let latest = checkpoints::latest(db, min_cosigned).await?;
    let Some(cp) = latest.filter(|c| c.size >= seq as u64) else {
        anyhow::bail!(
            "event {id} (seq {seq}) is in no checkpoint{} yet: try again after the next one",
            if min_cosigned > 0 {
                format!(" with {min_cosigned} cosignatures")
            } else {
                String::new()
            }
        );
    };
    let event = query(
        db,
        &AuditFilter {
            after_seq: Some(seq - 1),
            limit: 1,
            ..Default::default()
        },
    )
    .await?
    .pop()
    .ok_or_else(|| anyhow::anyhow!("event seq {seq} could not be read"))?;
    let proof = tree::inclusion_proof(db, cp.size, seq as u64 - 1).await?;
    Ok(InclusionProof {
        event,
        leaf_index: seq as u64 - 1,
        checkpoint: cp.cosigned(),
        proof: proof.iter().map(|h| B64.encode(h.0)).collect(),
    })
}

/// Checks an inclusion proof as an auditor (or a runner) would: the checkpoint verifies with
/// `log_key`, the event's hash is recomputed from its fields, and the audit path leads from
/// its leaf to the checkpoint's root. Returns the checkpoint.
pub fn check_inclusion(p: &InclusionProof, keys: &Verifiers) -> Result<Checkpoint, String> {
    let (note, cp) = checkpoint::parse(p.checkpoint.as_bytes()).map_err(|e| e.to_string())?;
    checkpoint::verify(&note, keys).map_err(|e| format!("checkpoint: {e}"))?;
    let recomputed = p.event.compute_hash();
    if recomputed != p.event.hash {
        return Err(format!(
            "the event's fields hash to {recomputed}, not to its stored hash {}",
            p.event.hash
        ));
    }
    if p.leaf_index + 1 != p.event.seq as u64 {
        return Err(format!(
            "leaf {} is not event seq {}",
            p.leaf_index, p.event.seq
        ));
    }
    let proof = proof_hashes(&p.proof)?;
    verify_inclusion(
        event_leaf(&p.event.hash)?,
        p.leaf_index,
        cp.size(),
        &proof,
        *cp.hash(),
    )
    .map_err(|e| format!("inclusion proof: {e}"))?;
    Ok(cp)
}

/// The witnesses an auditor trusts (`--witness-key`) and how many of them must have
/// cosigned the newest stored checkpoint (`--witness-quorum`).
pub struct WitnessQuorum {
    /// Each witness's name and its cosignature key: each counts once.
    witnesses: Vec<(String, Verifiers)>,
    quorum: usize,
}

impl WitnessQuorum {
    /// From verifier key texts (`name+id+base64`, type 0x04 cosignature/v1, as `emisar witness
    /// keygen` prints them) and a quorum (default: all of them), for the log of `log_key`.
    /// Refuses by the rule the server and the runners apply to theirs
    /// ([`crate::tlog::keys::check_witnesses`]): a key that is not a witness key, the log's
    /// own key (re-encoded as a cosignature key), one key given twice (under one name or
    /// two), a quorum outside 1 to the number of keys; and a witness named twice. Each error
    /// names the option.
    pub fn new(log_key: &str, keys: &[String], quorum: Option<usize>) -> Result<Self, String> {
        let keys: Vec<&str> = keys.iter().map(|k| k.trim()).collect();
        let quorum = quorum.unwrap_or(keys.len());
        crate::tlog::keys::check_witnesses(
            log_key,
            "--witness-key",
            &keys,
            quorum,
            "--witness-quorum",
        )
        .map_err(|e| e.0)?;
        let mut witnesses: Vec<(String, Verifiers)> = Vec::new();
        for key in keys {
            let verifiers =
                Verifiers::parse([key]).map_err(|e| format!("--witness-key {key}: {e}"))?;
            let name = key.split('+').next().unwrap_or_default().to_owned();
            if witnesses.iter().any(|(n, _)| *n == name) {
                return Err(format!(
                    "--witness-key: the witness {name} is given twice (each witness counts once)"
                ));
            }
            witnesses.push((name, verifiers));
        }
        Ok(WitnessQuorum { witnesses, quorum })
    }
}

/// What a witness answered to `GET /checkpoint/<origin>` (`audit verify --witness-url`), not
/// yet verified.
pub struct WitnessAnswer {
    /// The `--witness-url` it came from.
    pub url: String,
    pub body: Vec<u8>,
}

/// The latest checkpoint a witness cosigned, its signatures verified.
#[derive(Debug, Clone, Serialize)]
pub struct WitnessView {
    /// The witness, by the name of the `--witness-key` whose cosignature verified.
    pub witness: String,
    pub url: String,
    pub size: u64,
    /// The root hash, base64.
    pub root: String,
    /// When the witness cosigned it (the cosignature's time, RFC 3339).
    pub cosigned_at: Option<String>,
    #[serde(skip)]
    root_hash: Hash,
}

/// Verifies each witness's answer: a checkpoint of `origin`, signed by the log key (`keys`)
/// and cosigned by exactly one of the trusted witnesses, each witness answering once. An
/// error names the `--witness-url` and the rule; it says nothing yet about the log.
pub fn witness_views(
    answers: &[WitnessAnswer],
    origin: &str,
    keys: &Verifiers,
    trusted: &WitnessQuorum,
) -> Result<Vec<WitnessView>, String> {
    let mut views: Vec<WitnessView> = Vec::new();
    for a in answers {
        let url = &a.url;
        let (note, cp) = checkpoint::parse(&a.body).map_err(|e| {
            format!("--witness-url {url}: the answer is not a signed checkpoint: {e}")
        })?;
        if cp.origin() != origin {
            return Err(format!(
                "--witness-url {url}: the witness answered with a checkpoint of {:?}, not of the log you verify ({origin:?})",
                cp.origin()
            ));
        }
        checkpoint::verify(&note, keys).map_err(|e| {
            format!("--witness-url {url}: the checkpoint the witness cosigned is not signed by --log-key: {e}")
        })?;
        let names = checkpoint::cosigned_by(&note, &trusted.witnesses);
        let witness = match names.as_slice() {
            [one] => *one,
            [] => {
                return Err(format!(
                    "--witness-url {url}: its checkpoint carries no cosignature that verifies with a --witness-key ({}): give the key of the witness at that URL",
                    trusted
                        .witnesses
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            several => {
                return Err(format!(
                    "--witness-url {url}: its checkpoint carries the cosignatures of several witnesses ({}); a witness answers with its own",
                    several.join(", ")
                ));
            }
        };
        if let Some(earlier) = views.iter().find(|v| v.witness == witness) {
            return Err(format!(
                "--witness-url {url}: answered for {witness}, as --witness-url {} did: give each witness's URL once",
                earlier.url
            ));
        }
        let (_, verifiers) = trusted
            .witnesses
            .iter()
            .find(|(n, _)| n == witness)
            .expect("a name cosigned_by returned");
        let cosigned_at = note
            .verify(verifiers)
            .ok()
            .and_then(|(ok, _)| ok.first().map(|s| s.signature().to_vec()))
            .and_then(|sig| crate::tlog::cosignature::timestamp(&sig[..]))
            .and_then(|t| chrono::DateTime::from_timestamp(t as i64, 0))
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        views.push(WitnessView {
            witness: witness.to_owned(),
            url: url.clone(),
            size: cp.size(),
            root: cp.hash().to_string(),
            cosigned_at,
            root_hash: *cp.hash(),
        });
    }
    Ok(views)
}

/// The outcome of verifying from a kept checkpoint.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GrowthReport {
    /// The kept checkpoint's size.
    pub kept_size: u64,
    /// The newest checkpoint the log key signed.
    pub latest_size: u64,
    /// Events checked against the newest checkpoint (`kept_size + 1 ..= latest_size`).
    pub verified: u64,
    /// Events after the newest checkpoint, chain-checked only.
    pub unchecked_by_checkpoint: u64,
    /// `None` when everything verified; else what failed.
    pub problem: Option<String>,
    /// The first event that differs from what the log key signed, or the range it lies in.
    pub first_changed: Option<(i64, i64)>,
    /// The trusted witnesses that cosigned the newest stored checkpoint; `None` when no
    /// witness key was given (cosignatures not checked).
    pub cosigned_by: Option<Vec<String>>,
    /// The quorum they were held to.
    pub witness_quorum: Option<usize>,
    /// The latest checkpoint each `--witness-url` witness cosigned; `None` when no URL was
    /// given.
    pub witness_checkpoints: Option<Vec<WitnessView>>,
}

/// `audit verify --checkpoint`: see the module's documentation. `witnesses`, when given, must
/// have cosigned the newest stored checkpoint; `answers` are the witnesses' latest cosigned
/// checkpoints (`--witness-url`, fetched before this reads the log), which the log must hold.
/// Steps 0 to 3 establish that the log extends the kept checkpoint, steps 4 to 6 check what
/// came after it; the first step that fails says why ([`Stop`]), and the report names it.
pub async fn verify_from(
    db: &Db,
    kept: &[u8],
    keys: &Verifiers,
    witnesses: Option<&WitnessQuorum>,
    answers: &[WitnessAnswer],
) -> anyhow::Result<GrowthReport> {
    let kept = kept_checkpoint(kept, keys)?;
    let views = witness_answers(answers, witnesses, kept.origin(), keys)?;
    let mut report = GrowthReport {
        kept_size: kept.size(),
        witness_quorum: witnesses.map(|w| w.quorum),
        witness_checkpoints: views.clone(),
        ..Default::default()
    };
    let views = views.unwrap_or_default();
    let stop = match extends_kept(db, &kept, keys, &views, &mut report).await? {
        Ok(extended) => {
            check_new_events(db, &kept, extended, witnesses, &views, &mut report).await?
        }
        Err(stop) => Some(stop),
    };
    match stop {
        None => Ok(report),
        Some(Stop::Found {
            problem,
            first_changed,
        }) => {
            report.problem = Some(problem);
            report.first_changed = first_changed;
            Ok(report)
        }
        Some(Stop::Rewritten(problem)) => {
            report.problem = Some(problem);
            finish_failed(db, report, kept.size(), *kept.hash(), keys).await
        }
    }
}

/// Why verifying from a kept checkpoint stopped: the problem its report names.
#[derive(Debug, PartialEq)]
enum Stop {
    /// The problem, with the first changed event when the step that found it names one.
    Found {
        problem: String,
        first_changed: Option<(i64, i64)>,
    },
    /// History the auditor saw was rewritten: the log up to the kept size is rebuilt from its
    /// events to name the first one that differs from what the log key signed
    /// ([`finish_failed`]).
    Rewritten(String),
}

impl Stop {
    /// A problem that names no changed event.
    fn found(problem: String) -> Stop {
        Stop::Found {
            problem,
            first_changed: None,
        }
    }
}

/// A step of verifying that reads the log: a fault reading it (the outer error), or what the
/// step established, or why the log fails it.
type Step<T> = anyhow::Result<Result<T, Stop>>;

/// What steps 0 to 3 established: the newest stored checkpoint, signed by the log key, extends
/// the kept one, whose tree's right edge ends on the event the chain goes on from.
struct Extended {
    latest: checkpoints::Stored,
    /// The newest checkpoint's size and root.
    big_n: u64,
    latest_root: Hash,
    /// The kept tree's right edge, to grow with the new events.
    edge: Frontier,
    /// The kept checkpoint's last event (`None` when it is empty).
    anchor: Option<Anchor>,
}

/// The checkpoint the auditor kept (`--checkpoint`), signed by the log key.
fn kept_checkpoint(kept: &[u8], keys: &Verifiers) -> anyhow::Result<Checkpoint> {
    let (note, kept) = checkpoint::parse(kept).map_err(|e| anyhow::anyhow!("--checkpoint: {e}"))?;
    checkpoint::verify(&note, keys).map_err(|e| anyhow::anyhow!("--checkpoint: {e}"))?;
    Ok(kept)
}

/// The witnesses' answers (`--witness-url`) to a log of `origin`, verified against the keys of
/// the witnesses the auditor trusts (`--witness-key`); `None` when no URL was given.
fn witness_answers(
    answers: &[WitnessAnswer],
    witnesses: Option<&WitnessQuorum>,
    origin: &str,
    keys: &Verifiers,
) -> anyhow::Result<Option<Vec<WitnessView>>> {
    match (answers.is_empty(), witnesses) {
        (true, _) => Ok(None),
        (false, Some(trusted)) => Ok(Some(
            witness_views(answers, origin, keys, trusted).map_err(anyhow::Error::msg)?,
        )),
        (false, None) => anyhow::bail!(
            "--witness-url: give the --witness-key of each witness it names, to check its cosignature"
        ),
    }
}

/// Steps 0 to 3: the log still holds what the kept checkpoint and the witnesses committed to,
/// its newest stored checkpoint (its size goes in `report`) is the log key's and extends the
/// kept one, and the chain is anchored in the kept tree.
async fn extends_kept(
    db: &Db,
    kept: &Checkpoint,
    keys: &Verifiers,
    views: &[WitnessView],
    report: &mut GrowthReport,
) -> Step<Extended> {
    let (n, kept_root) = (kept.size(), *kept.hash());
    // 0. The log still holds every event the kept checkpoint committed to, and every event a
    // witness cosigned. No rebuild to name a first changed event: the log key signs whatever
    // the database holds, so the stored checkpoints of the sizes the log lost and grew back
    // through commit to the new events, not to the ones the kept checkpoint covers.
    if let Some(problem) = lost_events(last_seq(db).await? as u64, n, views) {
        return Ok(Err(Stop::found(problem)));
    }
    // 1. The newest stored checkpoint is the log key's, and no smaller than the kept one.
    let (latest, latest_cp) = match newest_signed(checkpoints::latest(db, 0).await?, keys)? {
        Ok(newest) => newest,
        Err(problem) => return Ok(Err(Stop::Rewritten(problem))),
    };
    let (big_n, latest_root) = (latest_cp.size(), *latest_cp.hash());
    report.latest_size = big_n;
    if big_n < n {
        return Ok(Err(Stop::Rewritten(format!(
            "the log's newest checkpoint has {big_n} events, fewer than the {n} of the one you kept: it was rolled back"
        ))));
    }
    // 2. The stored tree extends the kept one.
    let proof = tree::consistency_proof(db, n, big_n).await?;
    if n > 0
        && let Err(e) = verify_consistency(n, big_n, kept_root, latest_root, &proof)
    {
        return Ok(Err(Stop::Rewritten(format!(
            "the log does not extend the checkpoint you kept (size {n}): its consistency proof to size {big_n} fails ({e})"
        ))));
    }
    // 3. The chain is anchored in the kept tree.
    let (edge, anchor) = match anchored_in_kept(db, n, kept_root).await? {
        Ok(anchored) => anchored,
        Err(stop) => return Ok(Err(stop)),
    };
    Ok(Ok(Extended {
        latest,
        big_n,
        latest_root,
        edge,
        anchor,
    }))
}

/// Step 0: why the log, which holds `events` events, lost some of the `n` the kept checkpoint
/// committed to or of those a witness cosigned (`views`), if it did.
fn lost_events(events: u64, n: u64, views: &[WitnessView]) -> Option<String> {
    if events < n {
        return Some(format!(
            "the log has {events} events, fewer than the {n} of the kept checkpoint: truncated"
        ));
    }
    let removed: Vec<String> = views
        .iter()
        .filter(|v| v.size > events)
        .map(|v| {
            format!(
                "witness {} cosigned size {}{}, the log holds {events} events: events were removed (truncated)",
                v.witness,
                v.size,
                v.cosigned_at
                    .as_deref()
                    .map(|t| format!(" at {t}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    (!removed.is_empty()).then(|| removed.join("; "))
}

/// Step 1: the newest stored checkpoint (`latest`) with its parsed note, when there is one and
/// the log key signed it; else why the log is not the one the auditor kept a checkpoint of.
fn newest_signed(
    latest: Option<checkpoints::Stored>,
    keys: &Verifiers,
) -> anyhow::Result<Result<(checkpoints::Stored, Checkpoint), String>> {
    let Some(latest) = latest else {
        return Ok(Err(
            "the database holds no checkpoint at all, but you kept one: the log was replaced"
                .into(),
        ));
    };
    let (note, cp) = checkpoint::parse(latest.note.as_bytes())?;
    if let Err(e) = checkpoint::verify(&note, keys) {
        return Ok(Err(format!(
            "the newest stored checkpoint (size {}) is not signed by the log key: {e}",
            latest.size
        )));
    }
    Ok(Ok((latest, cp)))
}

/// Step 3: the stored tree's first `n` leaves hash to the kept root, and event `n`'s stored
/// hash is their last leaf. Returns that tree's right edge and event `n` (`None` when `n` is
/// 0), from which the chain goes on.
async fn anchored_in_kept(db: &Db, n: u64, kept_root: Hash) -> Step<(Frontier, Option<Anchor>)> {
    let edge = tree::frontier(db, n).await?;
    if edge.root() != kept_root {
        return Ok(Err(Stop::Rewritten(format!(
            "the stored tree's first {n} leaves do not hash to the checkpoint you kept"
        ))));
    }
    if n == 0 {
        return Ok(Ok((edge, None)));
    }
    let Some(anchor) = verify::anchor(db, n as i64).await? else {
        return Ok(Err(Stop::Found {
            problem: format!("event seq {n} is missing"),
            first_changed: Some((n as i64, n as i64)),
        }));
    };
    let path = tree::inclusion_proof(db, n, n - 1).await?;
    let leaf = event_leaf(&anchor.hash).map_err(anyhow::Error::msg)?;
    if verify_inclusion(leaf, n - 1, n, &path, kept_root).is_err() {
        return Ok(Err(Stop::Rewritten(format!(
            "event seq {n}'s stored hash is not the last leaf of the checkpoint you kept"
        ))));
    }
    Ok(Ok((edge, Some(anchor))))
}

/// Steps 4 to 6: the events after the kept checkpoint rebuild the newest one and every tree a
/// witness saw, and a quorum of the trusted witnesses cosigned the newest (the counts and the
/// cosigners go in `report`). Why not, or `None` when they do.
async fn check_new_events(
    db: &Db,
    kept: &Checkpoint,
    extended: Extended,
    witnesses: Option<&WitnessQuorum>,
    views: &[WitnessView],
    report: &mut GrowthReport,
) -> anyhow::Result<Option<Stop>> {
    let (n, kept_root) = (kept.size(), *kept.hash());
    let Extended {
        latest,
        big_n,
        latest_root,
        edge,
        anchor,
    } = extended;
    // 4. The new events, checked as `audit verify` checks them (fields → hash → link to the
    // one before), and the leaves of their recomputed hashes make the newest root, and the
    // root at each size a witness cosigned above `n`.
    let kept_edge_root = edge.root();
    let mut marks: Vec<u64> = views.iter().map(|v| v.size).collect();
    marks.push(big_n);
    let upto = marks.iter().copied().max().unwrap_or(big_n);
    let (chain, grown) = verify::verify_growing(db, n as i64, anchor, edge, upto, &marks).await?;
    if let Some(broken) = chain.broken.first() {
        return Ok(Some(Stop::Found {
            problem: format!("event seq {}: {}", broken.seq, broken.problem),
            first_changed: Some((broken.seq, broken.seq)),
        }));
    }
    let root_at = |size: u64| {
        if size == n {
            Some(kept_edge_root)
        } else {
            grown.root_at(size)
        }
    };
    report.verified = grown.tree.size().min(big_n) - n;
    report.unchecked_by_checkpoint = chain.checked.saturating_sub(report.verified);
    let newest = (big_n, latest_root);
    if let Some(stop) = newest_not_rebuilt(n, newest, grown.tree.size(), root_at(big_n)) {
        return Ok(Some(stop));
    }
    // 5. What each witness saw is what the log holds.
    if let Some(problem) = forks(db, views, n, kept_root, root_at).await? {
        return Ok(Some(Stop::found(problem)));
    }
    // 6. The witnesses followed the log to its newest checkpoint.
    match witnesses {
        Some(witnesses) => cosigned_by_quorum(db, &latest, witnesses, n, big_n, report).await,
        None => Ok(None),
    }
}

/// Step 4's verdict: why the events after the kept checkpoint (size `n`), which grew its tree
/// to `grown` leaves with the root `grown_root` at the newest checkpoint's size, do not
/// rebuild the newest checkpoint (`newest`: its size and root), if they do not.
fn newest_not_rebuilt(
    n: u64,
    (big_n, latest_root): (u64, Hash),
    grown: u64,
    grown_root: Option<Hash>,
) -> Option<Stop> {
    if grown < big_n {
        Some(Stop::found(format!(
            "the newest checkpoint has {big_n} events but the log only {grown}"
        )))
    } else if grown_root != Some(latest_root) {
        Some(Stop::Found {
            problem: format!(
                "events {} to {big_n} do not hash to the newest checkpoint's root",
                n + 1
            ),
            first_changed: Some((n as i64 + 1, big_n as i64)),
        })
    } else {
        None
    }
}

/// Step 6: which of the trusted witnesses cosigned the newest stored checkpoint (`latest`, of
/// size `big_n`; they go in `report`), and whether they make the quorum. When they do not, the
/// alarm the server's checkpointer raised after seq `n`, if any, explains why.
async fn cosigned_by_quorum(
    db: &Db,
    latest: &checkpoints::Stored,
    witnesses: &WitnessQuorum,
    n: u64,
    big_n: u64,
    report: &mut GrowthReport,
) -> anyhow::Result<Option<Stop>> {
    let (cosigned, _) = checkpoint::parse(latest.cosigned().as_bytes())?;
    let names = checkpoint::cosigned_by(&cosigned, &witnesses.witnesses);
    report.cosigned_by = Some(names.iter().map(|&n| n.to_owned()).collect());
    let Some(mut problem) = short_of_quorum(&names, witnesses.quorum, big_n) else {
        return Ok(None);
    };
    if let Some(alarm) = truncation_alarm(db, n as i64).await? {
        problem.push_str("; ");
        problem.push_str(&alarm);
    }
    Ok(Some(Stop::found(problem)))
}

/// Why `names`, the trusted witnesses that cosigned the newest stored checkpoint (of size
/// `big_n`), are fewer than `quorum`, if they are.
fn short_of_quorum(names: &[&str], quorum: usize, big_n: u64) -> Option<String> {
    (names.len() < quorum).then(|| {
        format!(
            "the newest stored checkpoint (size {big_n}) is cosigned by {} of the witnesses you trust ({}), it needs {}: the witnesses did not follow the log to it (they never cosign a log truncated and grown again, or a fork; nor anything while they are down, or for a second while the server submits it)",
            names.len(),
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            },
            quorum
        )
    })
}

/// Whether any witness's checkpoint differs from the log's tree at its size: above `n` the
/// root grown from the events' recomputed hashes (`root_at`), at or below it the stored tree's
/// consistency proof from the witness's size to the kept checkpoint. One sentence per fork.
async fn forks(
    db: &Db,
    views: &[WitnessView],
    n: u64,
    kept_root: Hash,
    root_at: impl Fn(u64) -> Option<Hash>,
) -> anyhow::Result<Option<String>> {
    let mut problems = Vec::new();
    for v in views {
        let at = v
            .cosigned_at
            .as_deref()
            .map(|t| format!(" at {t}"))
            .unwrap_or_default();
        if v.size > n {
            match root_at(v.size) {
                Some(root) if root == v.root_hash => {}
                Some(root) => problems.push(format!(
                    "witness {} cosigned size {}{at} with root {}, but the log's first {} events hash to {root}: the log forked from what the witness saw (events were replaced)",
                    v.witness, v.size, v.root, v.size
                )),
                // The events stopped short (a gap), which the chain check reports first.
                None => problems.push(format!(
                    "witness {} cosigned size {}{at}, but the log's events stop short of it",
                    v.witness, v.size
                )),
            }
        } else {
            let proof = tree::consistency_proof(db, v.size, n).await?;
            if let Err(e) = verify_consistency(v.size, n, v.root_hash, kept_root, &proof) {
                problems.push(format!(
                    "witness {} cosigned size {}{at} with root {}, which the checkpoint you kept (size {n}) does not extend ({e}): a fork (the log key signed two histories) or an altered stored tree",
                    v.witness, v.size, v.root
                ));
            }
        }
    }
    Ok((!problems.is_empty()).then(|| problems.join("; ")))
}

/// Whether events are missing from the log from seq `from` on (`seq` has no gaps; only
/// retention removes events, and only the oldest): None, or what is missing, as a sentence.
pub(crate) async fn missing_from(db: &Db, from: i64) -> Result<Option<String>, sqlx::Error> {
    let (count, last): (i64, Option<i64>) = db
        .guard(async {
            crate::with_pool!(db, pool => sqlx::query_as(
                "SELECT COUNT(*), MAX(seq) FROM audit_events WHERE seq >= $1")
                .bind(from).fetch_one(pool).await)
        })
        .await?;
    let expected = last.map_or(0, |last| last - from + 1);
    Ok((count != expected).then(|| {
        format!(
            "{} of the events from seq {from} to {} are not there",
            expected - count,
            last.unwrap_or(from)
        )
    }))
}

/// The number of events in the log: the last one's seq (`seq` has no gaps), 0 when empty.
async fn last_seq(db: &Db) -> Result<i64, sqlx::Error> {
    let last: Option<i64> = db
        .guard(async {
            crate::with_pool!(db, pool => sqlx::query_scalar(
                "SELECT MAX(seq) FROM audit_events").fetch_one(pool).await)
        })
        .await?;
    Ok(last.unwrap_or(0))
}

/// The first alarm the server's checkpointer wrote after seq `after` about a witness that has
/// cosigned more events than the log held (`checkpoints.rs`), as a sentence. It only explains
/// a failure found otherwise: the server's own word never makes a log verify.
async fn truncation_alarm(db: &Db, after: i64) -> Result<Option<String>, sqlx::Error> {
    let refusals = query(
        db,
        &AuditFilter {
            kind: Some(kind::WITNESS_REFUSED.into()),
            after_seq: Some(after),
            limit: 100,
            ..Default::default()
        },
    )
    .await?;
    Ok(refusals.iter().find_map(|e| {
        let d = e.detail.as_ref()?;
        let (witness_size, log_size) = (d["witness_size"].as_u64()?, d["log_size"].as_u64()?);
        Some(format!(
            "the server's checkpointer raised the alarm (event seq {}): witness {} has cosigned {witness_size} events, the log held {log_size}: truncated",
            e.seq,
            d["witness"].as_str().unwrap_or("?")
        ))
    }))
}

/// The events after seq `after`, oldest first, a page at a time.
async fn page_after(db: &Db, after: i64) -> Result<Vec<Event>, sqlx::Error> {
    query(
        db,
        &AuditFilter {
            after_seq: Some(after),
            limit: PAGE,
            ..Default::default()
        },
    )
    .await
}

/// Why event `e` does not follow `prev` (its predecessor's hash), if it does not.
fn check_link(e: &Event, prev: Option<&str>) -> Option<String> {
    let recomputed = e.compute_hash();
    if recomputed != e.hash {
        return Some(format!(
            "event seq {} ({}): its fields hash to {recomputed}, not to its stored hash",
            e.seq, e.id
        ));
    }
    if let Some(prev) = prev
        && e.prev_hash != prev
    {
        return Some(format!(
            "event seq {} ({}): prev_hash does not match the event before it",
            e.seq, e.id
        ));
    }
    None
}

/// History up to `n` was rewritten: rebuild it from the events and find the first event that
/// differs from what the log key signed (see the module's documentation).
async fn finish_failed(
    db: &Db,
    mut report: GrowthReport,
    n: u64,
    kept_root: Hash,
    keys: &Verifiers,
) -> anyhow::Result<GrowthReport> {
    // Every root the log key signed up to `n`: the stored checkpoints that still verify, and
    // the kept one.
    let mut signed: Vec<(u64, Hash)> = Vec::new();
    for (size, note) in checkpoints::all(db).await? {
        if size > n {
            break;
        }
        let Ok((parsed, cp)) = checkpoint::parse(note.as_bytes()) else {
            continue;
        };
        if checkpoint::verify(&parsed, keys).is_ok() && cp.size() == size {
            signed.push((size, *cp.hash()));
        }
    }
    signed.retain(|(s, _)| *s != n);
    signed.push((n, kept_root));
    let mut edge = Frontier::default();
    let mut prev: Option<String> = None;
    let mut last_good = 0u64;
    let mut signed = signed.into_iter().filter(|(s, _)| *s > 0).peekable();
    let mut after = 0i64;
    'events: while edge.size() < n {
        let page = page_after(db, after).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        for e in &page {
            if e.seq as u64 != edge.size() + 1 {
                report.first_changed = Some((edge.size() as i64 + 1, edge.size() as i64 + 1));
                break 'events;
            }
            if let Some(problem) = check_link(e, prev.as_deref()) {
                // Not even recomputed: the stored chain names the event itself.
                report.problem = Some(format!("{}; {problem}", report.problem.unwrap_or_default()));
                report.first_changed = Some((e.seq, e.seq));
                return Ok(report);
            }
            prev = Some(e.hash.clone());
            edge.push(event_leaf(&e.hash).map_err(anyhow::Error::msg)?);
            while let Some(&(size, root)) = signed.peek() {
                if size != edge.size() {
                    break;
                }
                signed.next();
                if edge.root() == root {
                    last_good = size;
                } else {
                    report.first_changed = Some((last_good as i64 + 1, size as i64));
                    break 'events;
                }
            }
            if edge.size() >= n {
                break 'events;
            }
        }
    }
    if report.first_changed.is_none() {
        report.first_changed = Some((last_good as i64 + 1, n as i64));
    }
    Ok(report)
}

/// The report as text, one line per finding, for `audit verify --checkpoint`.
pub(crate) fn report_text(r: &GrowthReport) -> String {
    match &r.problem {
        None => format!(
            "ok: the log extends the checkpoint you kept (size {}) to the newest signed checkpoint (size {}); {} new events verified, {} appended since (chain-checked); {}{}\n",
            r.kept_size,
            r.latest_size,
            r.verified,
            r.unchecked_by_checkpoint,
            match (&r.cosigned_by, r.witness_quorum) {
                (Some(names), Some(quorum)) =>
                    format!("cosigned by {} (quorum {quorum})", names.join(", ")),
                _ => "its cosignatures not checked (no --witness-key)".to_owned(),
            },
            match &r.witness_checkpoints {
                Some(views) => format!(
                    "; the log holds the tree each witness asked cosigned last: {}",
                    views
                        .iter()
                        .map(|v| format!(
                            "{} size {}{}",
                            v.witness,
                            v.size,
                            v.cosigned_at
                                .as_deref()
                                .map(|t| format!(" ({t})"))
                                .unwrap_or_default()
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => String::new(),
            }
        ),
        Some(problem) => {
            let mut text = format!("FAILED: {problem}\n");
            if let Some((from, to)) = r.first_changed {
                if from == to {
                    text.push_str(&format!(
                        "first changed event: seq {from} (differs from what the log key signed)\n"
                    ));
                } else {
                    text.push_str(&format!(
                        "first changed event: between seq {from} and seq {to} (the log key signed no checkpoint in between that could narrow it)\n"
                    ));
                }
            }
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tlog::keys::NoteKey;

    fn witness_key(name: &str, seed: u8) -> String {
        NoteKey::from_seed(name, [seed; 32]).unwrap().cosigner_key()
    }

    #[test]
    fn witness_keys_and_quorum_are_checked_naming_the_option() {
        let log_key = NoteKey::from_seed("log.example/audit", [3; 32]).unwrap();
        let log = log_key.verifier_key();
        let w1 = witness_key("witness.example/w1", 1);
        let w2 = witness_key("witness.example/w2", 2);
        let both = [w1.clone(), w2.clone()];
        assert_eq!(WitnessQuorum::new(&log, &both, None).unwrap().quorum, 2);
        assert_eq!(WitnessQuorum::new(&log, &both, Some(1)).unwrap().quorum, 1);
        let refused =
            |keys: &[String], quorum| WitnessQuorum::new(&log, keys, quorum).err().unwrap();
        let e = refused(&both, Some(3));
        assert_eq!(
            e,
            "--witness-quorum: 3 must be between 1 and the 2 witness keys"
        );
        assert!(refused(&both, Some(0)).starts_with("--witness-quorum: 0 "));
        // The log's own (Ed25519 note) key is no witness key.
        let e = refused(std::slice::from_ref(&log), None);
        assert!(
            e.starts_with("--witness-key[0]: ") && e.contains("0x04"),
            "{e}"
        );
        // Nor is it once re-encoded as a cosignature/v1 key (FINDING F2): its holder would be
        // its own witness.
        let e = refused(&[w1.clone(), log_key.cosigner_key()], Some(1));
        assert_eq!(
            e,
            "--witness-key[1]: this is the log's own key: a log cannot witness itself"
        );
        assert!(refused(&["garbage".into()], None).starts_with("--witness-key[0]: "));
        // One witness counts once, even under two keys, and one key even under two names.
        let again = witness_key("witness.example/w1", 9);
        let e = refused(&[w1.clone(), again], None);
        assert!(e.contains("witness.example/w1 is given twice"), "{e}");
        let renamed = witness_key("witness.example/w3", 1);
        let e = refused(&[w1.clone(), renamed], None);
        assert!(
            e.starts_with("--witness-key[1]: the same key as an earlier witness"),
            "{e}"
        );
    }

    /// A witness's answer: `log`'s checkpoint of `origin` at `size`, cosigned by `by`.
    fn answer(url: &str, origin: &str, size: u64, log: &NoteKey, by: &[&NoteKey]) -> WitnessAnswer {
        let signed =
            checkpoint::sign(origin, size, crate::tlog::tree::record_hash(b"x"), "", log).unwrap();
        let (mut note, _) = checkpoint::parse(&signed).unwrap();
        let cosigners: Vec<_> = by.iter().map(|k| k.cosigner()).collect();
        let signers: Vec<&dyn signed_note::Signer> = cosigners
            .iter()
            .map(|c| c as &dyn signed_note::Signer)
            .collect();
        note.add_sigs(&signers).unwrap();
        WitnessAnswer {
            url: url.into(),
            body: note.to_bytes(),
        }
    }

    #[test]
    fn a_witness_answer_counts_only_signed_by_the_log_and_cosigned_by_one_given_witness() {
        let log = NoteKey::from_seed("log.example/audit", [3; 32]).unwrap();
        let other_log = NoteKey::from_seed("log.example/audit", [4; 32]).unwrap();
        let w1 = NoteKey::from_seed("witness.example/w1", [1; 32]).unwrap();
        let w2 = NoteKey::from_seed("witness.example/w2", [2; 32]).unwrap();
        let w3 = NoteKey::from_seed("witness.example/w3", [5; 32]).unwrap();
        let keys = Verifiers::parse([log.verifier_key().as_str()]).unwrap();
        let trusted = WitnessQuorum::new(
            &log.verifier_key(),
            &[w1.cosigner_key(), w2.cosigner_key()],
            None,
        )
        .unwrap();
        let origin = "log.example/audit";
        let views = |answers: &[WitnessAnswer]| witness_views(answers, origin, &keys, &trusted);

        // Paired by the cosignature's key name, in any order.
        let ok = views(&[
            answer("https://b", origin, 9, &log, &[&w2]),
            answer("https://a", origin, 7, &log, &[&w1, &w3]),
        ])
        .unwrap();
        assert_eq!(
            ok.iter()
                .map(|v| (v.witness.as_str(), v.url.as_str(), v.size))
                .collect::<Vec<_>>(),
            [
                ("witness.example/w2", "https://b", 9),
                ("witness.example/w1", "https://a", 7)
            ]
        );
        assert!(ok[0].cosigned_at.as_deref().unwrap().ends_with('Z'));

        let refused = |answers: &[WitnessAnswer]| views(answers).err().unwrap();
        let e = refused(&[answer("https://a", origin, 7, &log, &[&w3])]);
        assert_eq!(
            e,
            "--witness-url https://a: its checkpoint carries no cosignature that verifies with a --witness-key (witness.example/w1, witness.example/w2): give the key of the witness at that URL"
        );
        let e = refused(&[answer("https://a", origin, 7, &log, &[&w1, &w2])]);
        assert!(
            e.starts_with("--witness-url https://a: its checkpoint carries the cosignatures of several witnesses (witness.example/w1, witness.example/w2)"),
            "{e}"
        );
        let e = refused(&[
            answer("https://a", origin, 7, &log, &[&w1]),
            answer("https://b", origin, 8, &log, &[&w1]),
        ]);
        assert_eq!(
            e,
            "--witness-url https://b: answered for witness.example/w1, as --witness-url https://a did: give each witness's URL once"
        );
        let e = refused(&[answer("https://a", origin, 7, &other_log, &[&w1])]);
        assert!(
            e.starts_with("--witness-url https://a: the checkpoint the witness cosigned is not signed by --log-key: "),
            "{e}"
        );
        let e = refused(&[answer("https://a", "log.example/other", 7, &log, &[&w1])]);
        assert_eq!(
            e,
            "--witness-url https://a: the witness answered with a checkpoint of \"log.example/other\", not of the log you verify (\"log.example/audit\")"
        );
        let e = refused(&[WitnessAnswer {
            url: "https://a".into(),
            body: b"<html>".to_vec(),
        }]);
        assert!(
            e.starts_with("--witness-url https://a: the answer is not a signed checkpoint: "),
            "{e}"
        );
    }

    #[test]
    fn the_ok_line_says_whether_cosignatures_were_checked() {
        let mut r = GrowthReport {
            kept_size: 3,
            latest_size: 5,
            verified: 2,
            ..Default::default()
        };
        assert!(
            report_text(&r).ends_with("its cosignatures not checked (no --witness-key)\n"),
            "{}",
            report_text(&r)
        );
        r.cosigned_by = Some(vec!["w1".into(), "w2".into()]);
        r.witness_quorum = Some(2);
        assert!(
            report_text(&r).ends_with("; cosigned by w1, w2 (quorum 2)\n"),
            "{}",
            report_text(&r)
        );
        r.witness_checkpoints = Some(vec![WitnessView {
            witness: "w1".into(),
            url: "https://w1".into(),
            size: 9,
            root: String::new(),
            cosigned_at: Some("2026-12-01T10:00:00Z".into()),
            root_hash: Hash::default(),
        }]);
        assert!(
            report_text(&r).ends_with(
                "; cosigned by w1, w2 (quorum 2); the log holds the tree each witness asked cosigned last: w1 size 9 (2026-12-01T10:00:00Z)\n"
            ),
            "{}",
            report_text(&r)
        );
    }

    /// `log`'s checkpoint of the audit log at `size`, over a root made of `size`.
    fn signed_at(size: u64, log: &NoteKey) -> Vec<u8> {
        let root = crate::tlog::tree::record_hash(&size.to_be_bytes());
        checkpoint::sign("log.example/audit", size, root, "", log).unwrap()
    }

    fn log_and_keys() -> (NoteKey, Verifiers) {
        let log = NoteKey::from_seed("log.example/audit", [3; 32]).unwrap();
        let keys = Verifiers::parse([log.verifier_key().as_str()]).unwrap();
        (log, keys)
    }

    #[test]
    fn the_kept_checkpoint_must_be_the_log_keys() {
        let (log, keys) = log_and_keys();
        let other_log = NoteKey::from_seed("log.example/audit", [4; 32]).unwrap();
        let kept = kept_checkpoint(&signed_at(7, &log), &keys).unwrap();
        assert_eq!((kept.size(), kept.origin()), (7, "log.example/audit"));
        let e = kept_checkpoint(&signed_at(7, &other_log), &keys).unwrap_err();
        assert!(e.to_string().starts_with("--checkpoint: "), "{e}");
        let e = kept_checkpoint(b"<html>", &keys).unwrap_err();
        assert!(e.to_string().starts_with("--checkpoint: "), "{e}");
    }

    #[test]
    fn witness_urls_are_checked_only_against_witness_keys() {
        let (log, keys) = log_and_keys();
        let w1 = NoteKey::from_seed("witness.example/w1", [1; 32]).unwrap();
        let trusted = WitnessQuorum::new(&log.verifier_key(), &[w1.cosigner_key()], None).unwrap();
        let origin = "log.example/audit";
        assert!(witness_answers(&[], None, origin, &keys).unwrap().is_none());
        assert!(
            witness_answers(&[], Some(&trusted), origin, &keys)
                .unwrap()
                .is_none()
        );
        let answers = [answer("https://a", origin, 7, &log, &[&w1])];
        let e = witness_answers(&answers, None, origin, &keys).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--witness-url: give the --witness-key of each witness it names, to check its cosignature"
        );
        let views = witness_answers(&answers, Some(&trusted), origin, &keys)
            .unwrap()
            .unwrap();
        assert_eq!(views.len(), 1);
        // A refused answer is refused here too, in the witness's words.
        let unsigned = [answer("https://a", origin, 7, &log, &[])];
        let e = witness_answers(&unsigned, Some(&trusted), origin, &keys).unwrap_err();
        assert!(
            e.to_string().starts_with("--witness-url https://a: "),
            "{e}"
        );
    }

    /// What witness `w1` said it cosigned: size `size`, at `cosigned_at`.
    fn view(size: u64, cosigned_at: Option<&str>) -> WitnessView {
        WitnessView {
            witness: "w1".into(),
            url: "https://w1".into(),
            size,
            root: String::new(),
            cosigned_at: cosigned_at.map(str::to_owned),
            root_hash: Hash::default(),
        }
    }

    #[test]
    fn events_the_kept_checkpoint_or_a_witness_committed_to_are_still_in_the_log() {
        assert_eq!(lost_events(9, 9, &[view(9, None)]), None);
        assert_eq!(lost_events(0, 0, &[]), None);
        assert_eq!(
            lost_events(8, 9, &[]).as_deref(),
            Some("the log has 8 events, fewer than the 9 of the kept checkpoint: truncated")
        );
        assert_eq!(
            lost_events(
                9,
                9,
                &[
                    view(12, Some("2026-12-01T10:00:00Z")),
                    view(9, None),
                    view(10, None)
                ]
            )
            .as_deref(),
            Some(
                "witness w1 cosigned size 12 at 2026-12-01T10:00:00Z, the log holds 9 events: events were removed (truncated); witness w1 cosigned size 10, the log holds 9 events: events were removed (truncated)"
            )
        );
    }

    #[test]
    fn the_newest_stored_checkpoint_must_be_there_and_the_log_keys() {
        let (log, keys) = log_and_keys();
        let other_log = NoteKey::from_seed("log.example/audit", [4; 32]).unwrap();
        let stored = |size, note: Vec<u8>| checkpoints::Stored {
            size,
            note: String::from_utf8(note).unwrap(),
            cosignatures: Vec::new(),
        };
        let (latest, cp) = newest_signed(Some(stored(9, signed_at(9, &log))), &keys)
            .unwrap()
            .unwrap();
        assert_eq!((latest.size, cp.size()), (9, 9));
        assert_eq!(
            newest_signed(None, &keys).unwrap().unwrap_err(),
            "the database holds no checkpoint at all, but you kept one: the log was replaced"
        );
        let e = newest_signed(Some(stored(9, signed_at(9, &other_log))), &keys)
            .unwrap()
            .unwrap_err();
        assert!(
            e.starts_with("the newest stored checkpoint (size 9) is not signed by the log key: "),
            "{e}"
        );
        // A stored note that is no checkpoint at all is a fault, not a verdict.
        assert!(newest_signed(Some(stored(9, b"<html>".to_vec())), &keys).is_err());
    }

    #[test]
    fn the_new_events_must_rebuild_the_newest_checkpoint() {
        let root = crate::tlog::tree::record_hash(b"root");
        let other = crate::tlog::tree::record_hash(b"other");
        assert_eq!(newest_not_rebuilt(3, (9, root), 9, Some(root)), None);
        assert_eq!(
            newest_not_rebuilt(3, (9, root), 8, None),
            Some(Stop::found(
                "the newest checkpoint has 9 events but the log only 8".into()
            ))
        );
        let changed = Some(Stop::Found {
            problem: "events 4 to 9 do not hash to the newest checkpoint's root".into(),
            first_changed: Some((4, 9)),
        });
        assert_eq!(newest_not_rebuilt(3, (9, root), 9, Some(other)), changed);
        assert_eq!(newest_not_rebuilt(3, (9, root), 12, None), changed);
    }

    #[test]
    fn the_newest_checkpoint_needs_a_quorum_of_cosignatures() {
        assert_eq!(short_of_quorum(&["w1", "w2"], 2, 9), None);
        assert_eq!(short_of_quorum(&[], 0, 9), None);
        let short = short_of_quorum(&["w1"], 2, 9).unwrap();
        assert!(
            short.starts_with(
                "the newest stored checkpoint (size 9) is cosigned by 1 of the witnesses you trust (w1), it needs 2: the witnesses did not follow the log to it"
            ),
            "{short}"
        );
        let none = short_of_quorum(&[], 1, 9).unwrap();
        assert!(
            none.contains("by 0 of the witnesses you trust (none), it needs 1"),
            "{none}"
        );
    }
}
