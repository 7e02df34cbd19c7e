//! Approvals signed by people, checked on the node: the statement a person signs
//! (`statement.rs`), a decision on a halted rollout (`decision.rs`), a grant (`grant.rs`: its
//! format and its one check, which the server and the runners both make), the review of a
//! break-glass window (`review.rs`), the two ways they sign it (an OpenSSH key, `sshsig.rs`; a passkey,
//! `webauthn.rs`), the approvers file a runner trusts (`approvers.rs`), and here the signature
//! as it travels and the one check of a quorum, which the server (when a person approves), the
//! runner (before a write runs) and `emisar audit verify-approvals` (offline) all use.

pub mod approvers;
pub mod decision;
pub mod grant;
pub mod review;
pub mod sshsig;
pub mod statement;
pub mod webauthn;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

pub use approvers::{Approvers, ApproversError, SignedApprovers};
pub use decision::{Choice, Decision, DecisionProof};
pub use statement::{Plan, Statement, StatementError};

/// The most signatures one call may carry.
pub const MAX_SIGNATURES: usize = 32;

/// The longest an approval lives by default, from its request to its expiry, in seconds: the
/// server's default `approval_ttl_secs` (15 min) and `approved_start_within_secs` (5 min), and
/// a minute of clock skew. Signers (`emisar approvals approve`, the portal) and runners refuse a
/// longer one unless told otherwise.
pub const DEFAULT_MAX_LIFETIME_SECS: u64 = 21 * 60;
/// The most any setting may allow: the server's longest `approval_ttl_secs` (a week) and
/// `approved_start_within_secs` (an hour), and a minute.
pub const MAX_LIFETIME_SECS: u64 = 7 * 24 * 3600 + 3600 + 60;
/// How far ahead of a signer's or runner's clock an approval may say it was requested.
pub const CLOCK_SKEW_SECS: u64 = 60;

/// When an approval was requested, in milliseconds since the epoch: the timestamp of its id,
/// a UUIDv7 (RFC 9562 §5.7) the server makes at request time. None for another form.
pub fn issued_millis(approval_id: &str) -> Option<u64> {
    let b = approval_id.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        approval_id
            .get(r)
            .filter(|s| s.bytes().all(|c| c.is_ascii_hexdigit()))
    };
    if b.len() != 36 || [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') || b[14] != b'7' {
        return None;
    }
    let (high, low) = (hex(0..8)?, hex(9..13)?);
    hex(14..18)?;
    hex(19..23)?;
    hex(24..36)?;
    u64::from_str_radix(&format!("{high}{low}"), 16).ok()
}

/// The time bounds on one approval that every signer and runner applies, given its id (a
/// UUIDv7, which says when it was requested), its expiry and the checker's clock: requested
/// no later than now (give or take [`CLOCK_SKEW_SECS`]), not expired, and living at most
/// `max_lifetime` seconds from request to expiry. Returns when it was requested, in
/// milliseconds since the epoch. Each error names the statement's field.
pub fn check_lifetime(
    approval_id: &str,
    expires: u64,
    now: u64,
    max_lifetime: u64,
) -> Result<u64, String> {
    let issued_ms = issued_millis(approval_id).ok_or_else(|| {
        format!(
            "`approval`: `{approval_id}` is not a UUIDv7, whose time says when it was requested"
        )
    })?;
    let issued = issued_ms / 1000;
    if issued > now + CLOCK_SKEW_SECS {
        return Err(format!(
            "`approval`: requested at {issued} (unix seconds), after this clock's {now}: an approval from the future is refused"
        ));
    }
    if now >= expires {
        return Err(format!(
            "`expires`: the approval expired at {expires} (unix seconds)"
        ));
    }
    if expires.saturating_sub(issued) > max_lifetime {
        return Err(format!(
            "`expires`: the approval lives {} s from its request to its expiry, more than the {max_lifetime} s allowed here (the server's approval_ttl_secs and approved_start_within_secs, and a minute)",
            expires.saturating_sub(issued)
        ));
    }
    Ok(issued_ms)
}

/// One person's signature over a statement's text, as the portal, the CLI, the store, the
/// audit log and the call carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Signature {
    /// `ssh-keygen -Y sign -n emisar-approval` over the statement's text (armored SSHSIG).
    Ssh {
        /// Who the portal or the CLI says signed (the node names people by key, not by this).
        signer: String,
        signature: String,
    },
    /// A passkey's assertion whose challenge is the statement's SHA-256 (fields base64url).
    Webauthn {
        signer: String,
        credential_id: String,
        authenticator_data: String,
        client_data_json: String,
        signature: String,
    },
}

impl Signature {
    pub fn signer(&self) -> &str {
        match self {
            Signature::Ssh { signer, .. } | Signature::Webauthn { signer, .. } => signer,
        }
    }
}

/// What the execution of a signed approval carries to the runner, inside the signed request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalProof {
    /// The statement's text as it was when people signed it (the runner compares it with its
    /// own rebuild and verifies the signatures over the rebuild).
    pub statement: String,
    pub signatures: Vec<Signature>,
    /// The approvers file, when the server carries one signed by the organisation's root key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvers: Option<SignedApprovers>,
}

/// What a runner tells the server of its signed approvals in its `/healthz` details, so the
/// server refuses to ask for an approval the runner would never accept, and says why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerApprovals {
    /// `require_signed_approvals`: the tools whose writes need people's signatures there.
    #[serde(default)]
    pub require_signed: Vec<String>,
    /// Hex SHA-256 of the runner's own approvers file, if it has one.
    #[serde(default)]
    pub approvers_sha256: Option<String>,
    /// The key ids of its `approvers_root_keys`.
    #[serde(default)]
    pub root_keys: Vec<String>,
    /// `require_witnessed`: its risk:high writes need a witnessed proof of their approval.
    #[serde(default)]
    pub require_witnessed: bool,
    /// `max_approval_lifetime_secs`: the longest an approval may live there, from request to
    /// expiry (None: a runner from before it was reported).
    #[serde(default)]
    pub max_approval_lifetime_secs: Option<u64>,
}

impl RunnerApprovals {
    /// Whether writes of `tool` need signatures on this runner.
    pub fn requires(&self, tool: &str) -> bool {
        self.require_signed
            .iter()
            .any(|p| glob::Pattern::new(p).is_ok_and(|p| p.matches(tool)))
    }
}

/// [`Signed::alg`] of an SSH signature.
pub const SSH_ALG: &str = "ssh-ed25519";

/// A signature that verified: which person of the approvers file made it, with which key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    /// The person's name in the approvers file.
    pub person: String,
    /// `SHA256:…` of an SSH key, or `passkey:<credential id>`.
    pub key_id: String,
    /// `ssh-ed25519`, `webauthn-es256` or `webauthn-eddsa`.
    pub alg: String,
    /// Hex SHA-256 of the statement signed.
    pub statement_sha256: String,
}

/// Verifies one signature over `text` and names the person of `approvers` who made it.
pub fn verify_signature(
    approvers: &Approvers,
    text: &str,
    signature: &Signature,
) -> Result<Signed, String> {
    let hash = statement::hash_text(text);
    let statement_sha256 = hex::encode(hash);
    match signature {
        Signature::Ssh { signature, .. } => {
            let key = sshsig::signer_key(signature).map_err(|e| e.to_string())?;
            let person = approvers.person_of_ssh(&key).ok_or_else(|| {
                format!(
                    "the key {} is not in the approvers file (sha256:{})",
                    sshsig::key_id(&key),
                    approvers.sha256
                )
            })?;
            sshsig::verify(&key, sshsig::APPROVAL_NAMESPACE, text.as_bytes(), signature)
                .map_err(|e| e.to_string())?;
            Ok(Signed {
                person: person.name.clone(),
                key_id: sshsig::key_id(&key),
                alg: SSH_ALG.into(),
                statement_sha256,
            })
        }
        Signature::Webauthn {
            credential_id,
            authenticator_data,
            client_data_json,
            signature,
            ..
        } => {
            let field = |name: &'static str, v: &str| {
                URL_SAFE_NO_PAD
                    .decode(v.as_bytes())
                    .map_err(|_| format!("`signature.{name}` must be base64url without padding"))
            };
            let assertion = webauthn::Assertion {
                credential_id: field("credential_id", credential_id)?,
                authenticator_data: field("authenticator_data", authenticator_data)?,
                client_data_json: field("client_data_json", client_data_json)?,
                signature: field("signature", signature)?,
            };
            let (person, key) = approvers
                .person_of_passkey(&assertion.credential_id)
                .ok_or_else(|| {
                    format!(
                        "the passkey {credential_id} is not in the approvers file (sha256:{})",
                        approvers.sha256
                    )
                })?;
            let rp = approvers
                .rp
                .as_ref()
                .ok_or("the approvers file has no [webauthn] section")?;
            webauthn::verify_assertion(rp, key, &hash, &assertion).map_err(|e| e.to_string())?;
            Ok(Signed {
                person: person.name.clone(),
                key_id: format!("passkey:{credential_id}"),
                alg: match key.alg {
                    webauthn::CoseAlg::ES256 => "webauthn-es256".into(),
                    webauthn::CoseAlg::EdDSA => "webauthn-eddsa".into(),
                },
                statement_sha256,
            })
        }
    }
}

/// The node's decision on a signed approval of `tool`: every signature verifies over `text`
/// and belongs to a person of `approvers`, no person counts twice (two keys of one person are
/// one person), and the people number at least the file's rule for `tool` and at least
/// `required`, the count the signed statement itself names (the policy may ask more people
/// than the file; what people signed for holds). The statement's expiry and the approval id's
/// single use are the caller's (it has the clock and the memory).
pub fn verify_quorum(
    approvers: &Approvers,
    tool: &str,
    text: &str,
    signatures: &[Signature],
    required: u32,
) -> Result<Vec<Signed>, String> {
    let rule = approvers.rule(tool).ok_or_else(|| {
        format!(
            "no rule of the approvers file (sha256:{}) covers `{tool}`",
            approvers.sha256
        )
    })?;
    if signatures.len() > MAX_SIGNATURES {
        return Err(format!("more than {MAX_SIGNATURES} signatures"));
    }
    let mut signed: Vec<Signed> = Vec::new();
    for (i, s) in signatures.iter().enumerate() {
        let one =
            verify_signature(approvers, text, s).map_err(|e| format!("signature {i}: {e}"))?;
        if signed.iter().any(|o| o.person == one.person) {
            return Err(format!(
                "signature {i}: `{}` signed already: two signatures by one person count once",
                one.person
            ));
        }
        signed.push(one);
    }
    if (signed.len() as u32) < rule.approvals {
        return Err(format!(
            "`{tool}` needs {} people's signatures under the approvers file (sha256:{}), and the call carries {}",
            rule.approvals,
            approvers.sha256,
            signed.len()
        ));
    }
    if (signed.len() as u32) < required {
        return Err(format!(
            "the signed statement says `required {required}`, and the call carries {} people's signatures",
            signed.len()
        ));
    }
    let ssh = signed.iter().filter(|s| s.alg == SSH_ALG).count() as u32;
    if ssh < rule.ssh_signatures {
        return Err(format!(
            "`{tool}` needs {} SSH signatures (made in the terminal, `emisar approvals approve`) under the approvers file (sha256:{}), and the call carries {ssh}",
            rule.ssh_signatures, approvers.sha256
        ));
    }
    Ok(signed)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::approvers::tests::file_with;
    use super::sshsig::tests::{sign, test_key};
    use super::*;

    fn ssh(seed: u8, text: &str) -> Signature {
        Signature::Ssh {
            signer: format!("p{seed}"),
            signature: sign(&test_key(seed), sshsig::APPROVAL_NAMESPACE, text.as_bytes()),
        }
    }

    fn two_needed() -> Approvers {
        let mut text = file_with(
            &[("alice", 1), ("bob", 2)],
            "[[rule]]\ntools = \"*\"\napprovals = 2\n",
        );
        // A second key of alice's.
        let second = test_key(3).public_key().to_openssh().unwrap();
        text = text.replacen("\"]\n", &format!("\", \"{second}\"]\n"), 1);
        Approvers::parse(&text).unwrap()
    }

    #[test]
    fn two_people_meet_a_quorum_of_two() {
        let a = two_needed();
        let signed = verify_quorum(&a, "t.x", "s", &[ssh(1, "s"), ssh(2, "s")], 1).unwrap();
        assert_eq!(signed[0].person, "alice");
        assert_eq!(signed[1].person, "bob");
        assert!(signed[0].key_id.starts_with("SHA256:"));
    }

    #[test]
    fn one_person_with_two_keys_counts_once() {
        let a = two_needed();
        let e = verify_quorum(&a, "t.x", "s", &[ssh(1, "s"), ssh(3, "s")], 1).unwrap_err();
        assert!(e.contains("count once"), "{e}");
    }

    #[test]
    fn too_few_other_text_or_unknown_keys_are_refused() {
        let a = two_needed();
        assert!(
            verify_quorum(&a, "t.x", "s", &[ssh(1, "s")], 1)
                .unwrap_err()
                .contains("needs 2")
        );
        assert!(verify_quorum(&a, "t.x", "s", &[ssh(1, "s"), ssh(2, "other")], 1).is_err());
        let e = verify_quorum(&a, "t.x", "s", &[ssh(1, "s"), ssh(7, "s")], 1).unwrap_err();
        assert!(e.contains("not in the approvers file"), "{e}");
    }

    #[test]
    fn a_rule_can_ask_for_signatures_from_the_terminal() {
        let text = file_with(
            &[("alice", 1), ("bob", 2)],
            "[[rule]]\ntools = \"*\"\napprovals = 2\nssh_signatures = 2\n",
        );
        let a = Approvers::parse(&text).unwrap();
        assert_eq!(
            verify_quorum(&a, "t.x", "s", &[ssh(1, "s"), ssh(2, "s")], 1)
                .unwrap()
                .len(),
            2
        );
        let more = Approvers::parse(&text.replace("ssh_signatures = 2", "ssh_signatures = 3"));
        assert!(more.unwrap_err().0.contains("`rule[0].ssh_signatures`"));
    }

    #[test]
    fn the_statements_required_count_holds_above_the_files_rule() {
        let a = two_needed();
        let e = verify_quorum(&a, "t.x", "s", &[ssh(1, "s"), ssh(2, "s")], 3).unwrap_err();
        assert!(e.contains("`required 3`"), "{e}");
    }

    /// A UUIDv7 whose time is `secs` (what [`issued_millis`] reads back), for tests.
    pub(crate) fn id_at(secs: u64) -> String {
        let ms = secs * 1000;
        format!(
            "{:08x}-{:04x}-7000-8000-000000000001",
            ms >> 16,
            ms & 0xffff
        )
    }

    #[test]
    fn an_approval_lives_from_its_uuidv7_to_its_expiry_within_bounds() {
        // 2026-12-06T10:00:00Z = 1_796_551_200 s; its UUIDv7 carries the milliseconds.
        let t = 1_796_551_200u64;
        let id = format!(
            "{:08x}-{:04x}-7abc-8def-0123456789ab",
            (t * 1000) >> 16,
            (t * 1000) & 0xffff
        );
        assert_eq!(issued_millis(&id), Some(t * 1000));
        assert_eq!(check_lifetime(&id, t + 1200, t + 10, 1260), Ok(t * 1000));
        let far = check_lifetime(&id, 4_070_908_800, t + 10, 1260).unwrap_err();
        assert!(
            far.starts_with("`expires`") && far.contains("1260"),
            "{far}"
        );
        assert!(
            check_lifetime(&id, t + 1200, t + 1200, 1260)
                .unwrap_err()
                .contains("expired")
        );
        assert!(
            check_lifetime(&id, t + 1200, t - 3600, 1260)
                .unwrap_err()
                .contains("future")
        );
        let v4 = "0193f4c2-7a10-4cc0-9f00-000000000001";
        assert!(
            check_lifetime(v4, t + 1200, t, 1260)
                .unwrap_err()
                .contains("UUIDv7")
        );
        for bad in [
            "",
            "x",
            "0193f4c2-7a10-7cc0-9f00-00000000000g",
            "0193f4c2_7a10-7cc0-9f00-000000000001",
        ] {
            assert_eq!(issued_millis(bad), None, "{bad}");
        }
    }
}
