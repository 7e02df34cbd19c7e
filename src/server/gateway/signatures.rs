//! The server's side of approvals signed by people (`crate::protocol::approval`): which
//! requests need signatures and from how many people, the statement people sign, each
//! signature verified as it comes (a passkey's signature counter too, which only the server
//! remembers), and the proof an approved execution carries to its runners.
//!
//! The server checks so that people learn at once what a runner would refuse later; the
//! runners decide. *Invariant:* a request whose runners check signatures is never asked of
//! people when the runners' approvers could not satisfy it (say why instead), and its
//! execution carries every signature with the statement exactly as stored.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Map, Value, json};

use super::state::Gateway;
use crate::digest::json_digest;
use crate::pack::ToolRef;
use crate::protocol::approval::webauthn::{self, WebauthnError};
use crate::protocol::approval::{
    ApprovalProof, Approvers, Plan, Signature, SignedApprovers, Statement, statement,
    verify_signature,
};
use crate::protocol::witnessed::Binding;
use crate::server::approvals::{self, Approval, ApprovalError, Verdict};
use crate::server::audit::{Noted, RefusalKey, kind};
use crate::server::passkeys::{self, PasskeyError};
use crate::server::principal::Principal;

/// `approvers_file` (and its root signature) as the server read them at start.
pub struct ServerApprovers {
    pub approvers: Approvers,
    pub signed: Option<SignedApprovers>,
}

impl ServerApprovers {
    pub(crate) fn load(file: &Path, signature: Option<&Path>) -> anyhow::Result<ServerApprovers> {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("approvers_file {}", file.display()))?;
        let approvers = Approvers::parse(&text)
            .with_context(|| format!("approvers_file {}", file.display()))?;
        let signed = match signature {
            Some(path) => {
                let signature = std::fs::read_to_string(path)
                    .with_context(|| format!("approvers_signature_file {}", path.display()))?;
                // The server does not know the runners' root keys; it checks the signature is
                // one over exactly this file, by the key inside it, so a stale or mismatched
                // pair fails here rather than on every runner.
                let key =
                    crate::protocol::approval::sshsig::signer_key(&signature).map_err(|e| {
                        anyhow::anyhow!("approvers_signature_file {}: {e}", path.display())
                    })?;
                let signed = SignedApprovers { text, signature };
                signed.verify(std::slice::from_ref(&key)).map_err(|e| {
                    anyhow::anyhow!(
                        "approvers_signature_file {} is not a signature over approvers_file {}: {e}",
                        path.display(),
                        file.display()
                    )
                })?;
                Some(signed)
            }
            None => None,
        };
        Ok(ServerApprovers { approvers, signed })
    }
}

impl Gateway {
    /// How many people must sign a request for `tool` on `runners` (`None`: no signatures,
    /// since neither this server nor any of the runners asks for them), or why no one could.
    pub(super) fn signatures_needed(
        &self,
        tool: &str,
        runners: &[String],
        policy_required: u32,
    ) -> Result<Option<u32>, String> {
        // Every runner that checks approvals itself (signatures or witnesses) must let a
        // request of this server live as long as it will: else it would refuse it at the end.
        let lives =
            self.limits.approval_ttl.as_secs() + self.limits.approved_start_within.as_secs() + 1;
        for r in runners {
            if let Some(a) = self.runners.approvals(r)
                && (a.requires(tool) || a.require_witnessed)
                && let Some(max) = a.max_approval_lifetime_secs
                && max < lives
            {
                return Err(format!(
                    "runner `{r}` lets an approval live {max} s (its max_approval_lifetime_secs), and this server's approval_ttl_secs and approved_start_within_secs make one live {lives} s: raise it on the runner or lower them here"
                ));
            }
        }
        let checking: Vec<(&String, _)> = runners
            .iter()
            .filter_map(|r| Some((r, self.runners.approvals(r)?)))
            .filter(|(_, a)| a.requires(tool))
            .collect();
        let Some(server) = &self.approvers else {
            return match checking.first() {
                None => Ok(None),
                Some((runner, _)) => Err(format!(
                    "runner `{runner}` runs `{tool}` only with people's signatures (require_signed_approvals), and this server has no approvers_file to ask for them: set approvers_file to the approvers file the runner trusts"
                )),
            };
        };
        for (runner, theirs) in &checking {
            match &theirs.approvers_sha256 {
                Some(digest) if *digest != server.approvers.sha256 => {
                    return Err(format!(
                        "runner `{runner}` trusts the approvers file sha256:{digest}, and this server's approvers_file is sha256:{}: deploy the same file to both",
                        server.approvers.sha256
                    ));
                }
                Some(_) => {}
                None if server.signed.is_none() => {
                    return Err(format!(
                        "runner `{runner}` takes its approvers file from the server only signed by its approvers_root_keys, and this server has no approvers_signature_file (`emisar approvers sign`)"
                    ));
                }
                None => {}
            }
        }
        if let Some(why) = server.approvers.unsatisfiable(tool, false) {
            return Err(why);
        }
        let rule = server
            .approvers
            .rule(tool)
            .expect("a satisfiable tool has a rule");
        Ok(Some(rule.approvals.max(policy_required)))
    }

    /// Why a write the policy lowered below approval cannot run on `runners` (None: it can).
    pub(super) fn lowering_refused(&self, tool: &str, runners: &[String]) -> Option<String> {
        let runner = runners
            .iter()
            .find(|r| self.runners.approvals(r).is_some_and(|a| a.requires(tool)))?;
        let allowed = self
            .approvers
            .as_ref()
            .is_some_and(|s| s.approvers.unsatisfiable(tool, true).is_none());
        (!allowed).then(|| {
            format!(
                "the policy lowers `{tool}` below approval, but runner `{runner}` runs it only with people's signatures (require_signed_approvals) and its approvers file does not allow it unapproved"
            )
        })
    }

    /// The salt of approval `approval_id`'s secret-param commitments (None: `tool` has no
    /// secret param): the audit key's HMAC of the id, so no store keeps it and nobody without
    /// the key can test a guess of a secret against the commitment a statement covers.
    pub(crate) fn commit_salt(&self, tool: &ToolRef, approval_id: &str) -> Option<String> {
        tool.secret_params().next()?;
        self.audit_key
            .as_ref()
            .map(|k| k.seal(&format!("emisar-commit/v1 {approval_id}")))
    }

    /// The arguments as people sign them (`statement::signed_args`): what the approvals API
    /// shows beside the statement, so a signer recomputes its `args` digest from them.
    pub(crate) fn signed_args(
        &self,
        approval_id: &str,
        tool_name: &str,
        args: &Map<String, Value>,
    ) -> Result<Map<String, Value>, String> {
        let tool = self
            .packs
            .tool(tool_name)
            .ok_or_else(|| format!("tool `{tool_name}` is no longer loaded"))?;
        let secret: Vec<&str> = tool.secret_params().collect();
        let salt = self.commit_salt(tool, approval_id);
        statement::signed_args(args, &secret, salt.as_deref()).map_err(|e| e.to_string())
    }

    /// The hex SHA-256 a statement's `args` line and a witnessed binding carry: of
    /// [`Gateway::signed_args`].
    fn signed_args_digest(
        &self,
        approval_id: &str,
        tool_name: &str,
        args: &Map<String, Value>,
    ) -> Result<String, String> {
        Ok(json_digest(&Value::Object(self.signed_args(
            approval_id,
            tool_name,
            args,
        )?)))
    }

    /// The statement people sign for a request, from what its runners will receive.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn statement_for(
        &self,
        approval_id: &str,
        tool: &str,
        pack_sha256: &str,
        args: &Map<String, Value>,
        runners: &[String],
        preview: Option<&Value>,
        plan: &Plan,
        required: u32,
        requester: &str,
        expires_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<String, String> {
        Statement {
            approval_id: approval_id.to_owned(),
            tool: tool.to_owned(),
            pack_sha256: pack_sha256.to_owned(),
            args_sha256: self.signed_args_digest(approval_id, tool, args)?,
            runners: preview_digests(runners, preview),
            plan: plan.clone(),
            required,
            policy_sha256: self.policy().digest(),
            requester: requester.to_owned(),
            expires_at: expires_at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        }
        .text()
        .map_err(|e| e.to_string())
    }

    /// What a request's `approval.approved` events bind (`protocol::witnessed::Binding`):
    /// the call its approval lets run, which a runner with `require_witnessed` compares with
    /// the call it receives. Its expiry is the statement's: the request's, and the time an
    /// approval has to start.
    pub(super) fn binding(&self, row: &Approval) -> Result<Binding, String> {
        let expires = chrono::DateTime::parse_from_rfc3339(&row.expires_at)
            .map_err(|e| format!("the request's expiry `{}`: {e}", row.expires_at))?
            .with_timezone(&chrono::Utc)
            + chrono::Duration::from_std(self.limits.approved_start_within)
                .unwrap_or(chrono::Duration::minutes(5))
            + chrono::Duration::seconds(1);
        Ok(Binding {
            tool: row.tool.clone(),
            pack_sha256: row.pack_sha256.clone(),
            args_sha256: self.signed_args_digest(&row.id, &row.tool, &row.args)?,
            runners: preview_digests(&row.runners, row.preview.as_ref()),
            expires_at: expires.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        })
    }

    /// A yes with a signature, verified over the request's statement against the approvers
    /// file: the verdict with what the server found, or a refusal that names the rule.
    pub(super) fn verify_vote(
        &self,
        row: &Approval,
        verdict: &Verdict,
    ) -> Result<Verdict, ApprovalError> {
        let Some(text) = &row.statement else {
            // `decide` refuses a signature on a request without a statement, and says why.
            return Ok(verdict.clone());
        };
        self.verify_signed(row, text, &row.votes, row.required_approvals, verdict)
    }

    /// A vote for a decision on a halted rollout, with a signature, verified over the
    /// decision's text as [`Gateway::verify_vote`] verifies one over a statement.
    pub(super) fn verify_decision_vote(
        &self,
        row: &Approval,
        decision_id: &str,
        verdict: &Verdict,
    ) -> Result<Verdict, ApprovalError> {
        match (&row.statement, &row.decision) {
            (Some(_), Some(d)) if d.id == decision_id => {
                self.verify_signed(row, &d.text, &d.votes, d.required, verdict)
            }
            // `halted::vote` refuses a stale decision, or a signature where none is signed.
            _ => Ok(verdict.clone()),
        }
    }

    /// A yes with a signature over `text` (of `row`'s tool), verified against the approvers
    /// file, with the votes so far and the count it needs: the verdict with what the server
    /// found, or a refusal that names the rule.
    fn verify_signed(
        &self,
        row: &Approval,
        text: &str,
        votes: &[approvals::Vote],
        required: u32,
        verdict: &Verdict,
    ) -> Result<Verdict, ApprovalError> {
        let Verdict::Approve {
            note,
            signature: Some(signature),
            ..
        } = verdict
        else {
            return Ok(verdict.clone());
        };
        let Some(server) = &self.approvers else {
            return Ok(verdict.clone());
        };
        let signed = verify_signature(&server.approvers, text, signature)
            .map_err(|e| ApprovalError::Refused(format!("`signature`: {e}")))?;
        // The votes so far must hold over the text as it stands: a text rewritten in the store
        // between two votes counts nobody twice for different things.
        for v in votes {
            if let Some(earlier) = &v.signature
                && verify_signature(&server.approvers, text, earlier).is_err()
            {
                return Err(ApprovalError::Refused(format!(
                    "the text people sign changed since `{}` signed it: their signature does not hold over it, so no vote counts; ask again",
                    v.user
                )));
            }
        }
        // The deciding vote: the runners will want the rule's SSH signatures among them all
        // (never more than the people it needs: one abort, which no runner checks, is one).
        let terminal = server
            .approvers
            .rule(&row.tool)
            .map_or(0, |r| r.ssh_signatures)
            .min(required);
        let ssh = votes
            .iter()
            .filter_map(|v| v.signed.as_ref())
            .chain(std::iter::once(&signed))
            .filter(|s| s.alg == crate::protocol::approval::SSH_ALG)
            .count() as u32;
        if votes.len() as u32 + 1 >= required && ssh < terminal {
            return Err(ApprovalError::Refused(format!(
                "`signature`: the approvers file asks for {terminal} SSH signatures for `{}` (made in the terminal: `emisar approvals`), and this would have {ssh}: sign it from the terminal",
                row.tool
            )));
        }
        Ok(Verdict::Approve {
            note: note.clone(),
            signature: Some(signature.clone()),
            signed: Some(signed),
        })
    }

    /// WebAuthn's signature counter for a passkey vote (WebAuthn L3 §7.2): once the signature
    /// verifies over the request's statement, its counter must be greater than the last one
    /// this server accepted from the credential (then it is remembered), else the vote is
    /// refused: the passkey may have been cloned. Audited as `passkey.sign_count_refused`
    /// (a person's repeats counted per window) and logged. Checked before the transition,
    /// since the store's compare-and-set cannot run inside it; a counter moved by a vote the
    /// transition then refuses stays moved, as the authenticator's own did.
    pub(super) async fn check_sign_count(
        &self,
        who: &Principal,
        id: &str,
        verdict: &Verdict,
        verify: impl Fn(&Approval, &Verdict) -> Result<Verdict, ApprovalError>,
    ) -> Result<(), ApprovalError> {
        let Verdict::Approve {
            signature:
                Some(Signature::Webauthn {
                    credential_id,
                    authenticator_data,
                    ..
                }),
            ..
        } = verdict
        else {
            return Ok(());
        };
        if self.approvers.is_none() {
            // No statement to sign: `decide` refuses the signature and says why.
            return Ok(());
        }
        let row = self.approvals.get(id).await?;
        let Verdict::Approve {
            signed: Some(signed),
            ..
        } = verify(&row, verdict)?
        else {
            return Ok(());
        };
        let asserted = URL_SAFE_NO_PAD
            .decode(authenticator_data)
            .ok()
            .and_then(|data| webauthn::sign_count(&data).ok())
            .ok_or_else(|| {
                ApprovalError::Refused("`signature.authenticator_data` has no signCount".into())
            })?;
        // Kept under the credential's canonical text, whatever padding the vote's had.
        let credential_id =
            URL_SAFE_NO_PAD.encode(URL_SAFE_NO_PAD.decode(credential_id).map_err(|_| {
                ApprovalError::Refused(
                    "`signature.credential_id` must be base64url without padding".into(),
                )
            })?);
        let refusal =
            match passkeys::advance_sign_count(self.approvals.db(), &credential_id, asserted).await
            {
                Ok(()) => return Ok(()),
                Err(PasskeyError::Refused(e @ WebauthnError::SignCount { stored, .. })) => {
                    (e, stored)
                }
                Err(PasskeyError::Store(e)) => return Err(ApprovalError::Store(e)),
                Err(e) => return Err(ApprovalError::Refused(format!("`signature`: {e}"))),
            };
        let (error, stored) = refusal;
        let mut event = row.event(
            &who.actor(),
            kind::PASSKEY_SIGN_COUNT_REFUSED,
            json!({
                "credential_id": credential_id,
                "person": signed.person,
                "stored_sign_count": stored,
                "asserted_sign_count": asserted,
            }),
        );
        event.outcome = Some("refused".into());
        let key = RefusalKey {
            kind: kind::PASSKEY_SIGN_COUNT_REFUSED,
            caller: who.actor(),
            class: "sign_count",
        };
        if self.audit.refused(key, event).await? == Noted::First {
            tracing::error!(
                approval_id = %id,
                person = %signed.person,
                credential_id = %credential_id,
                stored,
                asserted,
                "a passkey signature was refused: its signature counter did not grow, so the passkey may have been cloned"
            );
        }
        Err(ApprovalError::Refused(format!("`signature`: {error}")))
    }

    /// What an approved execution carries to its runners: the statement as people signed it,
    /// every signature, and the root-signed approvers file when the server has one.
    pub(super) fn proof_for(&self, row: &Approval) -> Option<ApprovalProof> {
        let statement = row.statement.clone()?;
        Some(ApprovalProof {
            statement,
            signatures: row
                .votes
                .iter()
                .filter_map(|v| v.signature.clone())
                .collect(),
            approvers: self.approvers.as_ref().and_then(|s| s.signed.clone()),
        })
    }
}

/// Every runner with the SHA-256 of the preview values it sealed, exactly as it will hash them:
/// the vars as it sealed them (`sealed_vars`, text), parsed back. None: no preview.
fn preview_digests(
    runners: &[String],
    preview: Option<&Value>,
) -> BTreeMap<String, Option<String>> {
    runners
        .iter()
        .map(|r| {
            let vars = preview.and_then(|p| {
                let text = p.get(r)?.get("sealed_vars")?.as_str()?;
                serde_json::from_str::<Value>(text).ok()
            });
            (r.clone(), vars.map(|v| json_digest(&v)))
        })
        .collect()
}
