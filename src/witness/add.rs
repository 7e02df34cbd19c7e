//! `add-checkpoint` of C2SP tlog-witness: parse the request, check the checkpoint against the
//! log's keys and against what this witness last cosigned for that origin, persist, cosign.
//!
//! The checks, in order: malformed body → 400; unknown origin → 404; no valid signature by a
//! configured key of the log, or a bad one → 403; `old` larger than the checkpoint → 400;
//! `old` not the size last cosigned (0 if never) → 409 with that size; a root that is not the
//! empty tree's at size 0, a different root at the same size, or a consistency proof that
//! does not prove the new tree extends the last one → 422 (a split view or a rewrite: logged
//! loudly as evidence); otherwise the new state, with the cosignature, is written to disk,
//! then the cosignature is returned.
//!
//! `GET /checkpoint/<origin>` ([`Witness::latest`]) reads that state back: the latest
//! checkpoint cosigned for an origin with the cosignature `add-checkpoint` returned, so an
//! auditor can ask each witness how far it saw the log go.
//!
//! *Invariant:* one lock is held from reading the last cosigned size to the durable write of
//! the new one, so two concurrent requests can never both extend the same old tree, and no
//! cosignature leaves before its state is on disk.

use std::collections::BTreeMap;

use signed_note::{Note, Signature, Signer as _};
use tokio::sync::Mutex;

use super::state::{Cosigned, State, StateFile};
use crate::tlog::checkpoint::{self, CheckpointError};
use crate::tlog::cosignature::Cosigner;
use crate::tlog::keys::Verifiers;
use crate::tlog::tree::{EMPTY_HASH, Hash, verify_consistency};

/// The most proof lines a request may carry (tlog-witness: 63).
pub const MAX_PROOF_LINES: usize = 63;

/// What `add-checkpoint` answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// 200: the witness's cosignature line(s), `— name base64(key ID ‖ time ‖ signature)\n`.
    Cosigned(Vec<u8>),
    /// 400: the request is malformed (the message says which rule).
    BadRequest(String),
    /// 403: the checkpoint carries no valid signature by the log's configured keys.
    Forbidden(String),
    /// 404: this witness does not witness that origin.
    UnknownLog,
    /// 409: `old` is not the size this witness last cosigned; here is that size.
    Conflict(u64),
    /// 422: the checkpoint does not extend the last cosigned one (split view, rewrite).
    Inconsistent(String),
    /// 500: the new state could not be made durable; nothing was cosigned.
    Internal,
}

/// What `GET /checkpoint/<origin>` answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Latest {
    /// 200: the signed checkpoint with this witness's cosignature.
    Cosigned(Vec<u8>),
    /// 404: this witness does not witness that origin.
    UnknownLog,
    /// 404: it witnesses that origin but has cosigned no checkpoint of it yet.
    NoneYet,
    /// 500: the stored checkpoint could not be served.
    Internal,
}

/// A log this witness cosigns.
pub struct Log {
    pub keys: Verifiers,
}

/// The witness: its key, its logs and its state.
pub struct Witness {
    cosigner: Cosigner,
    logs: BTreeMap<String, Log>,
    file: StateFile,
    state: Mutex<State>,
}

/// The parsed request head: `old <size>` and the consistency proof.
#[derive(Debug, PartialEq)]
pub struct Request<'a> {
    pub old: u64,
    pub proof: Vec<Hash>,
    pub checkpoint: &'a [u8],
}

/// Parses the body: `old N\n`, up to 63 base64 hash lines, a blank line, the signed checkpoint.
pub fn parse_request(body: &[u8]) -> Result<Request<'_>, String> {
    let split = body
        .windows(2)
        .position(|w| w == b"\n\n")
        .ok_or("the body is `old N`, proof lines, a blank line, then the checkpoint")?;
    let (head, checkpoint) = (&body[..split], &body[split + 2..]);
    let head = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8")?;
    let mut lines = head.split('\n');
    let old = lines
        .next()
        .and_then(|l| l.strip_prefix("old "))
        .ok_or("the first line is `old <size>`")?;
    if old.is_empty()
        || !old.bytes().all(|b| b.is_ascii_digit())
        || (old.len() > 1 && old.starts_with('0'))
    {
        return Err("old: a decimal size without leading zeros".into());
    }
    let old: u64 = old
        .parse()
        .map_err(|_| "old: a size that fits 64 bits".to_owned())?;
    let mut proof = Vec::new();
    for line in lines {
        if proof.len() == MAX_PROOF_LINES {
            return Err(format!("at most {MAX_PROOF_LINES} consistency proof lines"));
        }
        // 32 bytes in standard base64 with padding: 44 characters.
        if line.len() != 44 {
            return Err("a proof line is one base64 SHA-256 hash".into());
        }
        let h = Hash::parse_hash(line).map_err(|_| "a proof line is one base64 SHA-256 hash")?;
        proof.push(h);
    }
    Ok(Request {
        old,
        proof,
        checkpoint,
    })
}

impl Witness {
    /// A witness over `logs`, with the state kept in `file` (loaded now).
    pub fn new(
        cosigner: Cosigner,
        logs: BTreeMap<String, Log>,
        file: StateFile,
    ) -> anyhow::Result<Self> {
        let state = file.load()?;
        Ok(Witness {
            cosigner,
            logs,
            file,
            state: Mutex::new(state),
        })
    }

    /// The verifier key of this witness's cosignatures.
    pub fn verifier_key(&self) -> String {
        self.cosigner.verifier_key()
    }

    /// Handles one `add-checkpoint` body.
    pub async fn add_checkpoint(&self, body: &[u8]) -> Answer {
        let request = match parse_request(body) {
            Ok(r) => r,
            Err(rule) => return Answer::BadRequest(rule),
        };
        let (note, cp) = match checkpoint::parse(request.checkpoint) {
            Ok(parsed) => parsed,
            Err(e) => return Answer::BadRequest(e.to_string()),
        };
        let Some(log) = self.logs.get(cp.origin()) else {
            return Answer::UnknownLog;
        };
        match checkpoint::verify(&note, &log.keys) {
            Ok(()) => {}
            Err(e @ (CheckpointError::Unsigned | CheckpointError::BadSignature(_))) => {
                tracing::warn!(origin = cp.origin(), error = %e, "checkpoint refused: not signed by the log");
                return Answer::Forbidden(e.to_string());
            }
            Err(e) => return Answer::BadRequest(e.to_string()),
        }
        if request.old > cp.size() {
            return Answer::BadRequest(format!(
                "old ({}) is larger than the checkpoint's size ({})",
                request.old,
                cp.size()
            ));
        }

        let mut state = self.state.lock().await;
        let last = state.logs.get(cp.origin());
        let (last_size, last_root) = last.map_or((0, EMPTY_HASH), |c| (c.size, c.root));
        if request.old != last_size {
            return Answer::Conflict(last_size);
        }
        let refusal = if cp.size() == 0 && *cp.hash() != EMPTY_HASH {
            Some("a tree of size 0 has the empty tree's root".to_owned())
        } else {
            verify_consistency(last_size, cp.size(), last_root, *cp.hash(), &request.proof)
                .err()
                .map(|e| {
                    if last_size == cp.size() {
                        format!("a different root at the size already cosigned ({last_size})")
                    } else {
                        format!(
                            "the checkpoint does not extend the tree of size {last_size} \
                             cosigned before: {e}"
                        )
                    }
                })
        };
        if let Some(reason) = refusal {
            // Evidence of a split view or a rewritten log: both checkpoints carry the log's
            // signature.
            tracing::error!(
                origin = cp.origin(),
                cosigned_size = last_size,
                cosigned_root = %last_root,
                size = cp.size(),
                root = %cp.hash(),
                checkpoint = %String::from_utf8_lossy(request.checkpoint),
                "checkpoint refused as inconsistent with the one cosigned before: {reason}"
            );
            return Answer::Inconsistent(reason);
        }

        // Cosigned now, kept with the state, and sent only once that state is on disk.
        let lines = match self.cosign(&note) {
            Ok(lines) => lines,
            Err(e) => {
                tracing::error!(error = %e, "failed to cosign");
                return Answer::Internal;
            }
        };
        let mut next = state.clone();
        next.logs.insert(
            cp.origin().to_owned(),
            Cosigned {
                size: cp.size(),
                root: *cp.hash(),
                checkpoint: String::from_utf8_lossy(request.checkpoint).into_owned(),
                cosignature: Some(lines.clone()),
            },
        );
        let file = self.file.clone();
        let to_save = next.clone();
        let saved = tokio::task::spawn_blocking(move || file.save(&to_save)).await;
        match saved {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %format!("{e:#}"), "failed to persist the witness state; nothing cosigned");
                return Answer::Internal;
            }
            Err(e) => {
                tracing::error!(error = %e, "the state writer failed; nothing cosigned");
                return Answer::Internal;
            }
        }
        *state = next;
        drop(state);
        tracing::info!(
            origin = cp.origin(),
            old = last_size,
            size = cp.size(),
            "checkpoint cosigned"
        );
        Answer::Cosigned(lines.into_bytes())
    }

    /// This witness's cosignature line(s) over `note`'s text.
    fn cosign(&self, note: &Note) -> Result<String, String> {
        let mut cosigned = Note::new(note.text(), &[]).map_err(|e| e.to_string())?;
        cosigned
            .add_sigs(&[&self.cosigner])
            .map_err(|e| e.to_string())?;
        let bytes = cosigned.to_bytes();
        // The note is text, a blank line, then the signature lines; the answer is those lines.
        String::from_utf8(bytes[note.text().len() + 1..].to_vec()).map_err(|e| e.to_string())
    }

    /// `GET /checkpoint/<origin>`: the latest checkpoint this witness cosigned for `origin`,
    /// with the log's signature and this witness's cosignature as `add-checkpoint` returned
    /// it. Reads the state only.
    pub async fn latest(&self, origin: &str) -> Latest {
        if !self.logs.contains_key(origin) {
            return Latest::UnknownLog;
        }
        let Some(cosigned) = self.state.lock().await.logs.get(origin).cloned() else {
            return Latest::NoneYet;
        };
        match self.served(&cosigned) {
            Ok(note) => Latest::Cosigned(note),
            Err(e) => {
                tracing::error!(origin, error = %e, "failed to serve the latest cosigned checkpoint");
                Latest::Internal
            }
        }
    }

    /// The stored checkpoint with its signature lines as received, except any line by this
    /// witness's own key (a submitter may add anything), then this witness's cosignature.
    fn served(&self, c: &Cosigned) -> Result<Vec<u8>, String> {
        let (text, sigs) = c
            .checkpoint
            .rsplit_once("\n\n")
            .ok_or("the stored checkpoint is not a signed note")?;
        let own = (self.cosigner.name(), self.cosigner.key_id());
        let parse = |line: &str| {
            Signature::from_bytes(line.as_bytes())
                .map_err(|e| format!("a stored signature line: {e}"))
        };
        let mut kept = Vec::new();
        for line in sigs.lines() {
            let sig = parse(line)?;
            if (sig.name(), sig.id()) != own {
                kept.push(sig);
            }
        }
        let text = format!("{text}\n");
        match &c.cosignature {
            Some(lines) => {
                for line in lines.lines() {
                    kept.push(parse(line)?);
                }
                let note = Note::new(text.as_bytes(), &kept).map_err(|e| e.to_string())?;
                Ok(note.to_bytes())
            }
            None => {
                // A state from before the cosignature was kept: cosigned now, over the
                // checkpoint it cosigned then.
                let mut note = Note::new(text.as_bytes(), &kept).map_err(|e| e.to_string())?;
                note.add_sigs(&[&self.cosigner])
                    .map_err(|e| e.to_string())?;
                Ok(note.to_bytes())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(b: u8) -> String {
        Hash([b; 32]).to_string()
    }

    #[test]
    fn request_parsing_follows_the_rules() {
        let ok = format!("old 5\n{}\n{}\n\nCHECKPOINT", h(1), h(2));
        let r = parse_request(ok.as_bytes()).unwrap();
        assert_eq!(
            (r.old, r.proof.len(), r.checkpoint),
            (5, 2, &b"CHECKPOINT"[..])
        );
        let r = parse_request(b"old 0\n\nX").unwrap();
        assert_eq!((r.old, r.proof.len()), (0, 0));
        let bad = [
            ("old 05\n\nX".to_owned(), "leading zeros"),
            ("old -1\n\nX".to_owned(), "leading zeros"),
            ("old \n\nX".to_owned(), "leading zeros"),
            ("old 18446744073709551616\n\nX".to_owned(), "64 bits"),
            ("new 5\n\nX".to_owned(), "first line"),
            ("old 5\nX".to_owned(), "blank line"),
            (format!("old 5\n{}=\n\nX", h(1)), "proof line"),
            ("old 5\nAAAA\n\nX".to_owned(), "proof line"),
            (
                format!("old 5\n{}\n\nX", h(1).replace('A', "!")),
                "proof line",
            ),
            (
                format!(
                    "old 5\n{}\n\nX",
                    format!("{}\n", h(1)).repeat(64).trim_end()
                ),
                "at most 63",
            ),
        ];
        for (body, rule) in bad {
            let e = parse_request(body.as_bytes()).unwrap_err();
            assert!(e.contains(rule), "{body:?}: {e}");
        }
        let max = format!(
            "old 5\n{}\n\nX",
            format!("{}\n", h(1)).repeat(63).trim_end()
        );
        assert_eq!(parse_request(max.as_bytes()).unwrap().proof.len(), 63);
    }
}
