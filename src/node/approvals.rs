//! The node's own check of people's signatures before a risk:high write runs
//! (`require_signed_approvals` in runner.toml).
//!
//! The server signs every call, so a compromised server (or whoever holds `server.key`, or can
//! write the approvals table) could sign an approval id nobody gave. With this gate on, a
//! runner executes a write of a covered tool only when the call carries signatures, by distinct
//! people of the approvers file *this runner* trusts, over the statement the runner rebuilds
//! itself from the call (so no byte of what runs can differ from what they signed), enough of
//! them for the file's rule for the tool and for the statement's own `required`, requested
//! after this runner's state began and living no longer than `max_approval_lifetime_secs`,
//! before the statement's expiry. The caller records the approval id as executed
//! (`executed.rs`) before anything runs. A write the server's policy lowered runs only if the
//! file's rule allows the tool `unapproved`.
//!
//! The approvers file is the runner's own `approvers_file` (deployed by configuration
//! management, like `authorized_keys`), or else a file the server carries, counted only when
//! one of the runner's `approvers_root_keys` signed it, its `serial` is not below
//! `min_approvers_serial` nor the highest this runner has accepted, and at that highest serial
//! it is the very file accepted there (serial and SHA-256 kept in `state_dir`): an older file,
//! or another one under the same serial, with a removed person or a looser rule, is never
//! taken.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Context;
use serde_json::Value;
use ssh_key::PublicKey;

use crate::digest::json_digest;
use crate::protocol::CallRequest;
use crate::protocol::approval::grant::{self, GrantProof};
use crate::protocol::approval::{
    Approvers, RunnerApprovals, Signed, SignedApprovers, Statement, check_lifetime, decision,
    sshsig, statement, verify_quorum,
};
use crate::protocol::signing::{CallClaims, now};

/// The file, under `state_dir`, holding the highest approvers-file serial accepted and the
/// SHA-256 of the file accepted at it (`SERIAL SHA256`; a file from before the digest holds
/// the serial alone).
const SERIAL_FILE: &str = "approvers-serial";

pub(super) struct Gate {
    require: Vec<glob::Pattern>,
    require_text: Vec<String>,
    local: Option<Approvers>,
    root_keys: Vec<PublicKey>,
    state_dir: PathBuf,
    min_serial: u64,
    max_lifetime: u64,
    /// The highest serial of a carried approvers file accepted so far, and the SHA-256 of the
    /// file accepted at it.
    serial: Mutex<(u64, Option<String>)>,
}

/// What the gate found for one execution.
pub(super) struct Checked {
    /// The people who signed (None: a lowering the file allows unapproved).
    pub signed: Option<Vec<Signed>>,
    /// When the signed statement expires (unix seconds; 0 for a lowering).
    pub expires: u64,
}

/// What the runner's settings say; checked by [`Gate::load`].
pub(super) struct GateConfig<'a> {
    pub require_signed_approvals: &'a [String],
    pub approvers_file: Option<&'a std::path::Path>,
    pub approvers_root_keys: &'a [String],
    pub min_approvers_serial: u64,
    pub max_approval_lifetime_secs: u64,
    pub state_dir: &'a std::path::Path,
}

impl Gate {
    pub(super) fn load(c: GateConfig<'_>) -> anyhow::Result<Gate> {
        let mut require = Vec::new();
        for (i, p) in c.require_signed_approvals.iter().enumerate() {
            require.push(
                glob::Pattern::new(p)
                    .with_context(|| format!("require_signed_approvals[{i}] `{p}`"))?,
            );
        }
        let local = match c.approvers_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("approvers_file {}", path.display()))?;
                Some(
                    Approvers::parse(&text)
                        .with_context(|| format!("approvers_file {}", path.display()))?,
                )
            }
            None => None,
        };
        if let (Some(path), Some(local)) = (c.approvers_file, &local)
            && local.serial < c.min_approvers_serial
        {
            anyhow::bail!(
                "approvers_file {} has serial {}, below min_approvers_serial {}: deploy the current file",
                path.display(),
                local.serial,
                c.min_approvers_serial
            );
        }
        let mut root_keys = Vec::new();
        for (i, line) in c.approvers_root_keys.iter().enumerate() {
            root_keys.push(
                sshsig::read_public_key(&format!("approvers_root_keys[{i}]"), line)
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
            );
        }
        if !require.is_empty() && local.is_none() && root_keys.is_empty() {
            anyhow::bail!(
                "require_signed_approvals is set, so this runner needs people it trusts: set approvers_file (the approvers file, deployed like authorized_keys) or approvers_root_keys (the organisation keys whose signed approvers file the server may carry)"
            );
        }
        let gate = Gate {
            require,
            require_text: c.require_signed_approvals.to_vec(),
            local,
            root_keys,
            state_dir: c.state_dir.to_owned(),
            min_serial: c.min_approvers_serial,
            max_lifetime: c.max_approval_lifetime_secs,
            serial: Mutex::new((0, None)),
        };
        if gate.enabled() {
            gate.load_serial()?;
        }
        Ok(gate)
    }

    /// Whether any tool needs signatures here.
    pub(super) fn enabled(&self) -> bool {
        !self.require.is_empty()
    }

    /// Whether executions of `tool` (risk:high) need people's signatures here.
    pub(super) fn requires(&self, tool: &str) -> bool {
        self.require.iter().any(|p| p.matches(tool))
    }

    /// What `/healthz` tells the server (for a health token only), so it can refuse to ask
    /// for approvals this runner would never accept, and say why.
    pub(super) fn report(&self) -> RunnerApprovals {
        RunnerApprovals {
            require_signed: self.require_text.clone(),
            approvers_sha256: self.local.as_ref().map(|a| a.sha256.clone()),
            root_keys: self.root_keys.iter().map(sshsig::key_id).collect(),
            require_witnessed: false,
            max_approval_lifetime_secs: Some(self.max_lifetime),
        }
    }

    /// The check of one risk:high execution of a covered tool, with the tool's secret params
    /// (their commitments are what people signed) and when this runner's state began.
    pub(super) fn check(
        &self,
        runner: &str,
        claims: &CallClaims,
        request: &CallRequest,
        secret: &[&str],
        ledger: &super::executed::Executed,
    ) -> Result<Checked, String> {
        let proof = request.approval.as_ref();
        let approvers = self.approvers(proof.and_then(|p| p.approvers.as_ref()))?;
        let tool = &request.tool;
        let Some(approval_id) = claims.approval_id.as_deref() else {
            // No approval: only a policy lowering the file itself allows.
            return match approvers.rule(tool) {
                Some(rule) if rule.unapproved && claims.lowered_by_policy.is_some() => {
                    Ok(Checked {
                        signed: None,
                        expires: 0,
                    })
                }
                _ => Err(format!(
                    "`{tool}` needs people's signatures on this runner (require_signed_approvals), and its approvers file (sha256:{}) does not allow it unapproved; the server's policy cannot lower it here",
                    approvers.sha256
                )),
            };
        };
        let Some(proof) = proof else {
            return Err(format!(
                "`{tool}` needs people's signatures on this runner (require_signed_approvals), and the call carries none: approval {approval_id} was not signed"
            ));
        };
        let carried = Statement::parse(&proof.statement).map_err(|e| e.to_string())?;
        if !carried.runners.contains_key(runner) {
            return Err(format!(
                "the signed statement does not name this runner (`{runner}`)"
            ));
        }
        check_wave(&carried, runner, request.wave)?;
        // The rebuild: everything this runner can know itself comes from the call it received,
        // the rest (other runners' previews, the requester, the policy, the expiry, the count
        // of people) from the statement, which the signatures cover.
        let mut runners: BTreeMap<String, Option<String>> = carried.runners.clone();
        runners.insert(
            runner.to_owned(),
            request
                .preview
                .as_ref()
                .map(|p| json_digest(&Value::Object(p.clone()))),
        );
        let rebuilt = Statement {
            approval_id: approval_id.to_owned(),
            tool: tool.clone(),
            pack_sha256: claims.pack_sha256.clone(),
            args_sha256: statement::args_digest(
                &request.args,
                secret,
                request.secret_salt.as_deref(),
            )
            .map_err(|e| e.to_string())?,
            runners,
            ..carried.clone()
        };
        let text = rebuilt.text().map_err(|e| e.to_string())?;
        if text != proof.statement {
            let differs = text
                .lines()
                .zip(proof.statement.lines())
                .find(|(a, b)| a != b)
                .map(|(a, _)| a.split(' ').next().unwrap_or("").to_owned())
                .unwrap_or_default();
            return Err(format!(
                "the signed statement differs from this call in `{differs}`: people signed another write than this one"
            ));
        }
        let mut expires = rebuilt.expires_unix().map_err(|e| e.to_string())?;
        let t = now();
        // Under people's decision on a halted rollout, the decision's expiry stands for the
        // statement's: the statement is still held to its own lifetime bound, as at any
        // moment before it expired.
        let statement_clock = match &request.decision {
            Some(_) => t.min(expires.saturating_sub(1)),
            None => t,
        };
        let requested = check_lifetime(approval_id, expires, statement_clock, self.max_lifetime)
            .map_err(|e| format!("the signed statement: {e}"))?;
        ledger.check_requested(&format!("approval {approval_id}"), requested)?;
        let signed = verify_quorum(&approvers, tool, &text, &proof.signatures, rebuilt.required)?;
        if let Some(proof) = &request.decision {
            let held = decision::Held {
                tool,
                approval_id,
                statement: &text,
                required: rebuilt.required,
                runner: Some(runner),
            };
            let (decision, _) = decision::check(&approvers, &held, proof, t, self.max_lifetime)?;
            expires = decision.expires_unix().map_err(|e| e.to_string())?;
        }
        Ok(Checked {
            signed: Some(signed),
            expires,
        })
    }

    /// The check of one risk:high execution of a covered tool under a grant instead of an
    /// approval: the grant's one check ([`grant::check`]) against this runner's approvers file,
    /// its own name and labels and its bound `max_lifetime` on grants, and the grant asked for
    /// after this runner's state began (its uses are counted there). Counting and revocation
    /// are the caller's, in the ledger.
    pub(super) fn check_grant(
        &self,
        runner: &str,
        labels: &BTreeMap<String, String>,
        request: &CallRequest,
        proof: &GrantProof,
        max_lifetime: u64,
        ledger: &super::executed::Executed,
    ) -> Result<grant::Checked, String> {
        let approvers = self.approvers(proof.approvers.as_ref())?;
        let call = grant::Call {
            tool: &request.tool,
            runner,
            labels,
            args: &request.args,
            agent: None,
        };
        let checked = grant::check(&approvers, &call, proof, now(), max_lifetime)?;
        ledger.check_requested(&format!("grant {}", checked.grant.id), checked.requested_ms)?;
        Ok(checked)
    }

    /// The approvers file for this call: the runner's own, else a carried one under a root key.
    fn approvers(&self, carried: Option<&SignedApprovers>) -> Result<Approvers, String> {
        if let Some(local) = &self.local {
            return Ok(local.clone());
        }
        let carried = carried.ok_or(
            "this runner trusts an approvers file signed by its approvers_root_keys, and the call carries none",
        )?;
        let file = carried.verify(&self.root_keys).map_err(|e| e.to_string())?;
        if file.serial < self.min_serial {
            return Err(format!(
                "the carried approvers file has serial {}, below this runner's min_approvers_serial {}",
                file.serial, self.min_serial
            ));
        }
        let mut highest = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        let (serial, digest) = &*highest;
        if file.serial < *serial {
            return Err(format!(
                "the carried approvers file has serial {}, older than serial {serial} this runner accepted: an older file is never taken back",
                file.serial
            ));
        }
        if file.serial == *serial
            && let Some(digest) = digest
        {
            if *digest != file.sha256 {
                return Err(format!(
                    "the carried approvers file (sha256:{}) is not the one this runner accepted at serial {serial} (sha256:{digest}): one serial names one file, and `emisar approvers sign` raises it for every change",
                    file.sha256
                ));
            }
            return Ok(file);
        }
        crate::util::files::create_private_dir(&self.state_dir)
            .map_err(|e| format!("cannot create {}: {e}", self.state_dir.display()))?;
        crate::util::files::replace_private(
            &self.state_dir,
            SERIAL_FILE,
            format!("{} {}\n", file.serial, file.sha256).as_bytes(),
        )
        .map_err(|e| format!("cannot record the approvers file's serial: {e:#}"))?;
        *highest = (file.serial, Some(file.sha256.clone()));
        Ok(file)
    }

    /// Reads the highest serial accepted, and the digest of the file accepted at it.
    fn load_serial(&self) -> anyhow::Result<()> {
        let path = self.state_dir.join(SERIAL_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let mut words = text.split_whitespace();
        let serial = words
            .next()
            .and_then(|s| s.parse::<u64>().ok())
            .with_context(|| format!("{}: no serial", path.display()))?;
        let digest = words.next().map(str::to_owned);
        *self.serial.lock().unwrap_or_else(|p| p.into_inner()) = (serial, digest);
        Ok(())
    }
}

/// The signed plan places this runner in exactly one wave, and the call must run it in that
/// one: a server (or anyone with `server.key`) that sends the call in another wave, or without
/// a wave, runs a rollout people did not sign.
fn check_wave(statement: &Statement, runner: &str, wave: Option<u32>) -> Result<(), String> {
    let placed = statement.plan.wave_of(runner);
    if wave == placed {
        return Ok(());
    }
    let placed = placed.map_or_else(|| "no wave".to_owned(), |w| format!("wave {w}"));
    let called = wave.map_or_else(|| "without a wave".to_owned(), |w| format!("in wave {w}"));
    Err(format!(
        "the signed plan places this runner (`{runner}`) in {placed}, and the call runs it {called}: people signed another rollout than this one"
    ))
}
