//! A witnessed approval: the proof a runner with `require_witnessed` demands before a
//! risk:high write runs. The call carries the `approval.approved` event of its approval, the
//! event's inclusion proof (RFC 9162 §2.1.3) and the checkpoint it is against, signed by the
//! log key and cosigned (C2SP `cosignature/v1`) by witnesses. The runner checks all of it
//! against keys in its own runner.toml, so a server that hides an approval from the log, or
//! shows its witnesses a different log, cannot make it run the write.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};

use crate::protocol::audit_event::Event;
use crate::tlog::checkpoint;
use crate::tlog::keys::Verifiers;
use crate::tlog::tree::{Hash, leaf_hash, verify_inclusion};

/// The kind of event a witnessed approval proves.
pub const APPROVED: &str = "approval.approved";

/// What a call carries for a runner that requires witnessed approvals.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WitnessedApproval {
    /// The `approval.approved` event that settled the approval.
    pub event: Event,
    /// The checkpoint (signed note with cosignature lines).
    pub checkpoint: String,
    /// The audit path of leaf `event.seq - 1`, base64 hashes, leaf to root.
    pub proof: Vec<String>,
}

/// The keys a runner trusts for witnessed approvals (runner.toml).
pub struct WitnessTrust {
    pub log: Verifiers,
    /// One verifier per witness: each counts once.
    pub witnesses: Vec<(String, Verifiers)>,
    pub quorum: usize,
}

impl WitnessTrust {
    /// From key texts, naming the bad one.
    pub fn new(log_key: &str, witness_keys: &[String], quorum: usize) -> Result<Self, String> {
        let log = Verifiers::parse([log_key]).map_err(|e| format!("log_key: {e}"))?;
        let witnesses = witness_keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                Verifiers::parse([k.as_str()])
                    .map(|v| (k.split('+').next().unwrap_or_default().to_owned(), v))
                    .map_err(|e| format!("witness_keys[{i}]: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if quorum == 0 || quorum > witnesses.len() {
            return Err(format!(
                "witness_quorum: {quorum} must be between 1 and the {} witness keys",
                witnesses.len()
            ));
        }
        Ok(WitnessTrust {
            log,
            witnesses,
            quorum,
        })
    }
}

/// The leaf of an event: SHA-256(0x00 ‖ its 32-byte chain hash).
pub fn event_leaf(hash_hex: &str) -> Result<Hash, String> {
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(hash_hex, &mut bytes)
        .map_err(|e| format!("event hash `{hash_hex}` is not 64 hex digits: {e}"))?;
    Ok(leaf_hash(&bytes))
}

/// Checks that `w` proves approval `approval_id` was approved in the log the runner trusts:
/// the event is that approval's `approval.approved`, its hash is its fields', the checkpoint
/// is signed by the log key and cosigned by `quorum` distinct trusted witnesses, and the
/// audit path leads from the event's leaf to the checkpoint's root. Returns the witnesses
/// that cosigned. Every failure names what failed.
pub fn verify(
    w: &WitnessedApproval,
    approval_id: &str,
    trust: &WitnessTrust,
) -> Result<Vec<String>, String> {
    let e = &w.event;
    if e.kind != APPROVED {
        return Err(format!("the event is a `{}`, not `{APPROVED}`", e.kind));
    }
    if e.approval_id.as_deref() != Some(approval_id) {
        return Err(format!(
            "the event approves {:?}, not this call's approval {approval_id}",
            e.approval_id
        ));
    }
    let recomputed = e.compute_hash();
    if recomputed != e.hash {
        return Err(format!(
            "the event's fields hash to {recomputed}, not to the hash it carries"
        ));
    }
    if e.seq < 1 {
        return Err(format!("event seq {} is not a leaf", e.seq));
    }
    let (note, cp) = checkpoint::parse(w.checkpoint.as_bytes()).map_err(|e| e.to_string())?;
    checkpoint::verify(&note, &trust.log).map_err(|e| format!("the log's signature: {e}"))?;
    let cosigned: Vec<String> = trust
        .witnesses
        .iter()
        .filter(|(_, keys)| checkpoint::verify(&note, keys).is_ok())
        .map(|(name, _)| name.clone())
        .collect();
    if cosigned.len() < trust.quorum {
        return Err(format!(
            "the checkpoint is cosigned by {} of the witnesses this runner trusts ({}), it needs {}",
            cosigned.len(),
            if cosigned.is_empty() {
                "none".to_owned()
            } else {
                cosigned.join(", ")
            },
            trust.quorum
        ));
    }
    let proof = w
        .proof
        .iter()
        .map(|l| {
            let b = B64
                .decode(l)
                .map_err(|e| format!("proof hash `{l}`: {e}"))?;
            Ok(Hash(b.try_into().map_err(|_| {
                format!("proof hash `{l}` is not 32 bytes")
            })?))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let leaf = event_leaf(&e.hash)?;
    verify_inclusion(leaf, e.seq as u64 - 1, cp.size(), &proof, *cp.hash()).map_err(|err| {
        format!(
            "the event (seq {}) is not in the checkpoint of {} events: {err}",
            e.seq,
            cp.size()
        )
    })?;
    Ok(cosigned)
}
