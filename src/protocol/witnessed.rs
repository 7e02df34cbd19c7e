//! A witnessed approval: the proof a runner with `require_witnessed` demands before a
//! risk:high write runs. The call carries the `approval.approved` event of its approval, the
//! event's inclusion proof (RFC 9162 §2.1.3) and the checkpoint it is against, signed by the
//! log key and cosigned (C2SP `cosignature/v1`) by witnesses. The runner checks all of it
//! against keys in its own runner.toml, so a server that hides an approval from the log, or
//! shows its witnesses a different log, cannot make it run the write.
//!
//! The event binds the call: its `detail` holds the request's state after that vote (only an
//! `approved` one, with its votes meeting its requirement, counts) and the [`Binding`] (tool,
//! pack digest, digest of the signed arguments, every runner with its preview digest, expiry),
//! which the runner compares with the call it received, so one honest approval of one write
//! proves nothing for another write, another runner, or a request still pending.

use std::collections::BTreeMap;

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

/// What an `approval.approved` event binds, in its `detail.binding`: exactly the call its
/// approval lets run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    pub tool: String,
    /// Hex SHA-256 of the tool's pack.
    pub pack_sha256: String,
    /// Hex SHA-256 of the signed arguments (`approval::statement::args_digest`: secret params
    /// as salted commitments), as a statement's `args` line has it.
    pub args_sha256: String,
    /// Every target runner, with the hex SHA-256 of the preview values it sealed (None: the
    /// tool has no preview).
    pub runners: BTreeMap<String, Option<String>>,
    /// `YYYY-MM-DDTHH:MM:SSZ`: no runner executes under this approval after it.
    pub expires_at: String,
}

/// The call a runner was asked to run, as it knows it itself.
pub struct Call<'a> {
    pub runner: &'a str,
    /// From the server's signed token.
    pub approval_id: &'a str,
    pub tool: &'a str,
    /// From the token, which the runner checked against its own pack.
    pub pack_sha256: &'a str,
    /// Recomputed from the arguments the runner received.
    pub args_sha256: &'a str,
    /// Recomputed from the preview values the runner received (under its own seal).
    pub preview_sha256: Option<&'a str>,
}

/// The keys a runner trusts for witnessed approvals (runner.toml).
pub struct WitnessTrust {
    pub log: Verifiers,
    /// One verifier per witness: each counts once.
    pub witnesses: Vec<(String, Verifiers)>,
    pub quorum: usize,
}

impl WitnessTrust {
    /// From key texts, naming the bad one: only distinct `cosignature/v1` keys, never the
    /// log's own, and a quorum of at least one ([`crate::tlog::keys::check_witnesses`]).
    pub fn new(log_key: &str, witness_keys: &[String], quorum: usize) -> Result<Self, String> {
        let log = Verifiers::parse([log_key]).map_err(|e| format!("log_key: {e}"))?;
        let keys: Vec<&str> = witness_keys.iter().map(String::as_str).collect();
        crate::tlog::keys::check_witnesses(
            log_key,
            "witness_keys",
            &keys,
            quorum,
            "witness_quorum",
        )
        .map_err(|e| e.0)?;
        let witnesses = witness_keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                Verifiers::parse([k.as_str()])
                    .map(|v| (k.split('+').next().unwrap_or_default().to_owned(), v))
                    .map_err(|e| format!("witness_keys[{i}]: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
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

/// An audit path as it travels (base64 hashes, leaf to root), decoded; what the runner
/// checks here and an auditor checks in `emisar audit prove` read it the same way.
pub fn proof_hashes(lines: &[String]) -> Result<Vec<Hash>, String> {
    lines
        .iter()
        .map(|l| {
            let b = B64
                .decode(l)
                .map_err(|e| format!("proof hash `{l}`: {e}"))?;
            Ok(Hash(b.try_into().map_err(|_| {
                format!("proof hash `{l}` is not 32 bytes")
            })?))
        })
        .collect()
}

/// What a witnessed approval proved.
#[derive(Debug)]
pub struct Verified {
    /// The witnesses that cosigned.
    pub cosigned: Vec<String>,
    /// When the approval was requested (unix milliseconds, from its UUIDv7 id).
    pub requested: u64,
    /// When it expires (unix seconds).
    pub expires: u64,
}

/// Checks that `w` proves `call` was approved in the log the runner trusts: the event is
/// that approval's `approval.approved`, its hash is its fields', the checkpoint is signed by
/// the log key and cosigned by `quorum` distinct trusted witnesses, and the audit path leads
/// from the event's leaf to the checkpoint's root; then that the event settled the request
/// (`approved`, its votes meeting its requirement), that its binding is this very call, and
/// that it lives within `max_lifetime` (requested no earlier, expiring no later, and the event
/// no older). Every failure names what failed.
pub fn verify(
    w: &WitnessedApproval,
    call: &Call<'_>,
    trust: &WitnessTrust,
    now: u64,
    max_lifetime: u64,
) -> Result<Verified, String> {
    let approval_id = call.approval_id;
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
    let cosigned = verify_included(e, &w.checkpoint, &w.proof, trust)?;
    let (requested, expires) = check_binding(e, call, now, max_lifetime)?;
    Ok(Verified {
        cosigned,
        requested,
        expires,
    })
}

/// Checks that event `e` is in the log `trust` names: its hash is its fields', the checkpoint
/// (`checkpoint_text`, a signed note) is signed by the log key and cosigned by `trust.quorum`
/// distinct trusted witnesses, and the audit path `proof` leads from the event's leaf to the
/// checkpoint's root. Returns the witnesses that cosigned. A runner checks a witnessed
/// approval with it, and the server a break-glass call's `grant.used` before the call runs
/// (it trusts no cosignature row of its database that does not verify).
pub fn verify_included(
    e: &Event,
    checkpoint_text: &str,
    proof: &[String],
    trust: &WitnessTrust,
) -> Result<Vec<String>, String> {
    let recomputed = e.compute_hash();
    if recomputed != e.hash {
        return Err(format!(
            "the event's fields hash to {recomputed}, not to the hash it carries"
        ));
    }
    if e.seq < 1 {
        return Err(format!("event seq {} is not a leaf", e.seq));
    }
    let (note, cp) = checkpoint::parse(checkpoint_text.as_bytes()).map_err(|e| e.to_string())?;
    checkpoint::verify(&note, &trust.log).map_err(|e| format!("the log's signature: {e}"))?;
    let cosigned: Vec<String> = checkpoint::cosigned_by(&note, &trust.witnesses)
        .into_iter()
        .map(str::to_owned)
        .collect();
    if cosigned.len() < trust.quorum {
        return Err(format!(
            "the checkpoint is cosigned by {} of the witnesses trusted here ({}), it needs {}",
            cosigned.len(),
            if cosigned.is_empty() {
                "none".to_owned()
            } else {
                cosigned.join(", ")
            },
            trust.quorum
        ));
    }
    let proof = proof_hashes(proof)?;
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

/// The proven event against the call: the request it settled, the binding, the lifetime.
fn check_binding(
    e: &Event,
    call: &Call<'_>,
    now: u64,
    max_lifetime: u64,
) -> Result<(u64, u64), String> {
    let detail = e.detail.as_ref();
    let number = |k: &str| detail.and_then(|d| d.get(k)).and_then(|v| v.as_u64());
    let state = detail.and_then(|d| d.get("state")).and_then(|v| v.as_str());
    let (Some(votes), Some(required)) = (number("votes"), number("required")) else {
        return Err("the event does not say the request's votes and requirement".into());
    };
    if state != Some("approved") || required == 0 || votes < required {
        return Err(format!(
            "the event is a vote that left the request {} ({votes} of {required} approvals): only the vote that approved it lets it run",
            state.unwrap_or("in no state")
        ));
    }
    let binding: Binding = detail
        .and_then(|d| d.get("binding"))
        .ok_or("the event binds no call (`detail.binding`): its server predates bound approvals")
        .and_then(|b| {
            serde_json::from_value(b.clone())
                .map_err(|_| "the event's `detail.binding` is not a binding")
        })?;
    let differs = |field: &str, bound: &str, here: &str| {
        Err(format!(
            "the approval binds `{field}` {bound}, and this call has {here}: it approved another write"
        ))
    };
    if binding.tool != call.tool {
        return differs("tool", &binding.tool, call.tool);
    }
    if binding.pack_sha256 != call.pack_sha256 {
        return differs("pack", &binding.pack_sha256, call.pack_sha256);
    }
    if binding.args_sha256 != call.args_sha256 {
        return differs("args", &binding.args_sha256, call.args_sha256);
    }
    let Some(preview) = binding.runners.get(call.runner) else {
        return Err(format!(
            "the approval binds the runners {:?}, not this runner (`{}`)",
            binding.runners.keys().collect::<Vec<_>>(),
            call.runner
        ));
    };
    if preview.as_deref() != call.preview_sha256 {
        return differs(
            "preview",
            preview.as_deref().unwrap_or("none"),
            call.preview_sha256.unwrap_or("none"),
        );
    }
    let expires = crate::protocol::approval::statement::parse_utc(&binding.expires_at)
        .ok_or("the binding's `expires_at` is not YYYY-MM-DDTHH:MM:SSZ")?;
    let requested =
        crate::protocol::approval::check_lifetime(call.approval_id, expires, now, max_lifetime)?;
    let at =
        e.at.get(..19)
            .and_then(|t| crate::protocol::approval::statement::parse_utc(&format!("{t}Z")))
            .ok_or("the event's `at` is not an RFC 3339 UTC time")?;
    if now.saturating_sub(at) > max_lifetime {
        return Err(format!(
            "the approval event is {} s old, older than the {max_lifetime} s an approval lives here",
            now.saturating_sub(at)
        ));
    }
    Ok((requested, expires))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::approval::tests::id_at;
    use crate::tlog::checkpoint;
    use crate::tlog::keys::NoteKey;
    use crate::tlog::tree::MemoryTree;
    use serde_json::{Value, json};

    const ORIGIN: &str = "emisar.test/audit";
    const NOW: u64 = 1_796_551_200;

    fn utc(secs: u64) -> String {
        let days = secs / 86_400;
        assert_eq!(days, 20_793, "the tests' clock is 2026-12-06");
        let s = secs % 86_400;
        format!(
            "2026-12-06T{:02}:{:02}:{:02}",
            s / 3600,
            s / 60 % 60,
            s % 60
        )
    }

    fn binding() -> Value {
        json!({"tool": "linux.systemctl_restart", "pack_sha256": "a".repeat(64),
               "args_sha256": "b".repeat(64), "runners": {"hvn05": null, "hvn06": "c".repeat(64)},
               "expires_at": format!("{}Z", utc(NOW + 900))})
    }

    fn event(kind: &str, approval_id: &str, detail: Value) -> Event {
        let mut e = Event {
            seq: 1,
            id: "e1".into(),
            at: format!("{}.000000Z", utc(NOW - 60)),
            actor: "approver:alice".into(),
            kind: kind.into(),
            tool: Some("linux.systemctl_restart".into()),
            runner: Some("hvn05".into()),
            args: Some(json!({"unit": "consul"})),
            reason: None,
            call_id: Some("c1".into()),
            approval_id: Some(approval_id.into()),
            outcome: None,
            result_digest: None,
            detail: Some(detail),
            prev_hash: "0".repeat(64),
            hash: String::new(),
            hash_v: 1,
        };
        e.hash = e.compute_hash();
        e
    }

    /// A log of one event, its checkpoint signed by the log key and cosigned by `witnesses`.
    fn proven(e: Event, log: &NoteKey, witnesses: &[&NoteKey]) -> WitnessedApproval {
        let mut tree = MemoryTree::default();
        tree.push_hash(event_leaf(&e.hash).unwrap());
        let signed = checkpoint::sign(ORIGIN, 1, tree.root(), "", log).unwrap();
        let (mut note, _) = checkpoint::parse(&signed).unwrap();
        let cosigners: Vec<_> = witnesses.iter().map(|w| w.cosigner()).collect();
        let signers: Vec<&dyn signed_note::Signer> = cosigners
            .iter()
            .map(|c| c as &dyn signed_note::Signer)
            .collect();
        note.add_sigs(&signers).unwrap();
        WitnessedApproval {
            event: e,
            checkpoint: String::from_utf8(note.to_bytes()).unwrap(),
            proof: Vec::new(),
        }
    }

    struct Keys {
        log: NoteKey,
        w1: NoteKey,
        w2: NoteKey,
        trust: WitnessTrust,
    }

    fn keys() -> Keys {
        let log = NoteKey::generate(ORIGIN).unwrap();
        let w1 = NoteKey::generate("witness.test/w1").unwrap();
        let w2 = NoteKey::generate("witness.test/w2").unwrap();
        let trust = WitnessTrust::new(
            &log.verifier_key(),
            &[w1.cosigner_key(), w2.cosigner_key()],
            2,
        )
        .unwrap();
        Keys { log, w1, w2, trust }
    }

    fn call<'a>(id: &'a str, runner: &'a str) -> Call<'a> {
        Call {
            runner,
            approval_id: id,
            tool: "linux.systemctl_restart",
            pack_sha256: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            args_sha256: "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
            preview_sha256: None,
        }
    }

    fn approved(id: &str) -> Event {
        event(
            APPROVED,
            id,
            json!({"state": "approved", "votes": 2, "required": 2, "binding": binding()}),
        )
    }

    #[test]
    fn a_proven_approval_runs_only_the_call_it_binds() {
        let k = keys();
        let id = id_at(NOW - 120);
        let w = proven(approved(&id), &k.log, &[&k.w1, &k.w2]);
        let ok = verify(&w, &call(&id, "hvn05"), &k.trust, NOW, 1260).unwrap();
        assert_eq!(ok.cosigned.len(), 2);
        assert_eq!(ok.requested, (NOW - 120) * 1000);
        let other = "d".repeat(64);
        let cases: [(Call<'_>, &str); 5] = [
            (
                Call {
                    tool: "linux.systemctl_reload",
                    ..call(&id, "hvn05")
                },
                "binds `tool`",
            ),
            (
                Call {
                    pack_sha256: &other,
                    ..call(&id, "hvn05")
                },
                "binds `pack`",
            ),
            (
                Call {
                    args_sha256: &other,
                    ..call(&id, "hvn05")
                },
                "binds `args`",
            ),
            (call(&id, "hvn07"), "not this runner (`hvn07`)"),
            (call(&id, "hvn06"), "binds `preview`"),
        ];
        for (c, why) in cases {
            let e = verify(&w, &c, &k.trust, NOW, 1260).unwrap_err();
            assert!(e.contains(why), "`{e}` does not say `{why}`");
        }
        // Too few witnesses.
        let one = proven(approved(&id), &k.log, &[&k.w1]);
        let e = verify(&one, &call(&id, "hvn05"), &k.trust, NOW, 1260).unwrap_err();
        assert!(e.contains("cosigned by 1"), "{e}");
    }

    #[test]
    fn only_the_vote_that_approved_the_request_counts() {
        let k = keys();
        let id = id_at(NOW - 120);
        let pending = event(
            APPROVED,
            &id,
            json!({"state": "pending", "votes": 1, "required": 2, "binding": binding()}),
        );
        let e = verify(
            &proven(pending, &k.log, &[&k.w1, &k.w2]),
            &call(&id, "hvn05"),
            &k.trust,
            NOW,
            1260,
        )
        .unwrap_err();
        assert!(e.contains("only the vote that approved it"), "{e}");
        // Another kind of event about the request, whatever its detail says.
        let requested = event(
            "approval.requested",
            &id,
            json!({"state": "approved", "votes": 2, "required": 2, "binding": binding()}),
        );
        let e = verify(
            &proven(requested, &k.log, &[&k.w1, &k.w2]),
            &call(&id, "hvn05"),
            &k.trust,
            NOW,
            1260,
        )
        .unwrap_err();
        assert!(e.contains("not `approval.approved`"), "{e}");
        // An event that binds nothing (a server from before bindings).
        let bare = event(
            APPROVED,
            &id,
            json!({"state": "approved", "votes": 1, "required": 1}),
        );
        let e = verify(
            &proven(bare, &k.log, &[&k.w1, &k.w2]),
            &call(&id, "hvn05"),
            &k.trust,
            NOW,
            1260,
        )
        .unwrap_err();
        assert!(e.contains("binds no call"), "{e}");
    }

    #[test]
    fn an_approval_lives_no_longer_than_the_runner_allows() {
        let k = keys();
        let id = id_at(NOW - 120);
        let w = proven(approved(&id), &k.log, &[&k.w1, &k.w2]);
        // Long after: expired, and its event too old.
        let e = verify(&w, &call(&id, "hvn05"), &k.trust, NOW + 3600, 7200).unwrap_err();
        assert!(e.contains("expired"), "{e}");
        let e = verify(&w, &call(&id, "hvn05"), &k.trust, NOW + 800, 600).unwrap_err();
        assert!(e.contains("`expires`"), "{e}");
        // Requested long before its expiry.
        let old = id_at(NOW - 7200);
        let w = proven(approved(&old), &k.log, &[&k.w1, &k.w2]);
        let e = verify(&w, &call(&old, "hvn05"), &k.trust, NOW, 1260).unwrap_err();
        assert!(e.contains("`expires`"), "{e}");
    }

    #[test]
    fn a_runner_trusts_only_distinct_cosigners_that_are_not_the_log() {
        let k = keys();
        let log = k.log.verifier_key();
        let ok = |keys: &[String], q| WitnessTrust::new(&log, keys, q).err().unwrap_or_default();
        assert!(ok(&[k.w1.cosigner_key()], 1).is_empty());
        // The log's own Ed25519 key, or its key as a cosigner: whoever holds it is no witness.
        assert!(ok(std::slice::from_ref(&log), 1).contains("cosignature/v1"));
        assert!(ok(&[k.log.cosigner_key()], 1).contains("the log's own key"));
        // One key listed twice meets no quorum of two.
        let twice = ok(&[k.w1.cosigner_key(), k.w1.cosigner_key()], 2);
        assert!(twice.contains("counts once"), "{twice}");
        let renamed = NoteKey::from_seed("witness.test/other", [7; 32]).unwrap();
        let same = NoteKey::from_seed("witness.test/w7", [7; 32]).unwrap();
        let twice = ok(&[renamed.cosigner_key(), same.cosigner_key()], 2);
        assert!(twice.contains("counts once"), "{twice}");
        assert!(ok(&[k.w1.cosigner_key()], 0).contains("witness_quorum"));
        assert!(ok(&[k.w1.cosigner_key()], 2).contains("witness_quorum"));
        let _ = k.w2;
    }
}
