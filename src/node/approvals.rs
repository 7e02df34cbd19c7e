//! The node's own check of people's signatures before a risk:high write runs
//! (`require_signed_approvals` in runner.toml).
//!
//! The server signs every call, so a compromised server (or whoever holds `server.key`, or can
//! write the approvals table) could sign an approval id nobody gave. With this gate on, a
//! runner executes a write of a covered tool only when the call carries signatures, by distinct
//! people of the approvers file *this runner* trusts, over the statement the runner rebuilds
//! itself from the call (so no byte of what runs can differ from what they signed), enough of
//! them for the file's rule for the tool, before the statement's expiry, under an approval id
//! never executed here (kept in `state_dir`, so a restart does not forget it). A write the
//! server's policy lowered runs only if the file's rule allows the tool `unapproved`.
//!
//! The approvers file is the runner's own `approvers_file` (deployed by configuration
//! management, like `authorized_keys`), or else a file the server carries, counted only when
//! one of the runner's `approvers_root_keys` signed it and its `serial` is not below the
//! highest this runner has accepted (kept in `state_dir`), so an older file with a removed
//! person cannot be replayed.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Context;
use serde_json::Value;
use ssh_key::PublicKey;

use crate::digest::json_digest;
use crate::protocol::CallRequest;
use crate::protocol::approval::{
    ApprovalProof, Approvers, RunnerApprovals, Signed, Statement, sshsig, verify_quorum,
};
use crate::protocol::signing::{CallClaims, now};

/// The file, under `state_dir`, of approval ids executed under signatures (`ID EXPIRY` lines).
const EXECUTED_FILE: &str = "approvals-executed";
/// The file, under `state_dir`, holding the highest approvers-file serial accepted.
const SERIAL_FILE: &str = "approvers-serial";

/// Why the gate refused: a second execution of one approval (409), or anything else (403).
#[derive(Debug)]
pub enum Refusal {
    Reused(String),
    Forbidden(String),
}

impl From<String> for Refusal {
    fn from(why: String) -> Self {
        Refusal::Forbidden(why)
    }
}

pub struct Gate {
    require: Vec<glob::Pattern>,
    require_text: Vec<String>,
    local: Option<Approvers>,
    root_keys: Vec<PublicKey>,
    state_dir: PathBuf,
    /// The highest serial of a carried approvers file accepted so far.
    serial: Mutex<u64>,
    /// Approval ids executed under signatures, with their statement's expiry (unix seconds).
    executed: Mutex<HashMap<String, u64>>,
}

/// What the runner's settings say; checked by [`Gate::load`].
pub struct GateConfig<'a> {
    pub require_signed_approvals: &'a [String],
    pub approvers_file: Option<&'a std::path::Path>,
    pub approvers_root_keys: &'a [String],
    pub state_dir: &'a std::path::Path,
}

impl Gate {
    pub fn load(c: GateConfig<'_>) -> anyhow::Result<Gate> {
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
            serial: Mutex::new(0),
            executed: Mutex::new(HashMap::new()),
        };
        if gate.enabled() {
            gate.load_state()?;
        }
        Ok(gate)
    }

    /// Whether any tool needs signatures here.
    pub fn enabled(&self) -> bool {
        !self.require.is_empty()
    }

    /// Whether executions of `tool` (risk:high) need people's signatures here.
    pub fn requires(&self, tool: &str) -> bool {
        self.require.iter().any(|p| p.matches(tool))
    }

    /// What `/healthz` tells the server (for a health token only), so it can refuse to ask
    /// for approvals this runner would never accept, and say why.
    pub fn report(&self) -> RunnerApprovals {
        RunnerApprovals {
            require_signed: self.require_text.clone(),
            approvers_sha256: self.local.as_ref().map(|a| a.sha256.clone()),
            root_keys: self.root_keys.iter().map(sshsig::key_id).collect(),
            require_witnessed: false,
        }
    }

    /// The check of one risk:high execution of a covered tool. `Ok(None)` for a write the
    /// policy lowered and the file allows unapproved; `Ok(Some(signed))` for a quorum.
    pub fn check(
        &self,
        runner: &str,
        claims: &CallClaims,
        request: &CallRequest,
    ) -> Result<Option<Vec<Signed>>, Refusal> {
        let proof = request.approval.as_ref();
        let approvers = self.approvers(proof)?;
        let tool = &request.tool;
        let Some(approval_id) = claims.approval_id.as_deref() else {
            // No approval: only a policy lowering the file itself allows.
            return match approvers.rule(tool) {
                Some(rule) if rule.unapproved && claims.lowered_by_policy.is_some() => Ok(None),
                _ => Err(Refusal::Forbidden(format!(
                    "`{tool}` needs people's signatures on this runner (require_signed_approvals), and its approvers file (sha256:{}) does not allow it unapproved; the server's policy cannot lower it here",
                    approvers.sha256
                ))),
            };
        };
        let Some(proof) = proof else {
            return Err(Refusal::Forbidden(format!(
                "`{tool}` needs people's signatures on this runner (require_signed_approvals), and the call carries none: approval {approval_id} was not signed"
            )));
        };
        let carried = Statement::parse(&proof.statement).map_err(|e| e.to_string())?;
        if !carried.runners.contains_key(runner) {
            return Err(Refusal::Forbidden(format!(
                "the signed statement does not name this runner (`{runner}`)"
            )));
        }
        // The rebuild: everything this runner can know itself comes from the call it received,
        // the rest (other runners' previews, the requester, the policy, the expiry) from the
        // statement, which the signatures cover.
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
            args_sha256: json_digest(&Value::Object(request.args.clone())),
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
            return Err(Refusal::Forbidden(format!(
                "the signed statement differs from this call in `{differs}`: people signed another write than this one"
            )));
        }
        let expires = rebuilt.expires_unix().map_err(|e| e.to_string())?;
        if now() >= expires {
            return Err(Refusal::Forbidden(format!(
                "the signed statement expired at {}",
                rebuilt.expires_at
            )));
        }
        let signed = verify_quorum(&approvers, tool, &text, &proof.signatures)?;
        self.first_execution(approval_id, expires)?;
        Ok(Some(signed))
    }

    /// The approvers file for this call: the runner's own, else a carried one under a root key.
    fn approvers(&self, proof: Option<&ApprovalProof>) -> Result<Approvers, String> {
        if let Some(local) = &self.local {
            return Ok(local.clone());
        }
        let carried = proof.and_then(|p| p.approvers.as_ref()).ok_or(
            "this runner trusts an approvers file signed by its approvers_root_keys, and the call carries none",
        )?;
        let file = carried.verify(&self.root_keys).map_err(|e| e.to_string())?;
        let mut highest = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        if file.serial < *highest {
            return Err(format!(
                "the carried approvers file has serial {}, older than serial {} this runner accepted: an older file is never taken back",
                file.serial, *highest
            ));
        }
        if file.serial > *highest {
            std::fs::create_dir_all(&self.state_dir)
                .map_err(|e| format!("cannot create {}: {e}", self.state_dir.display()))?;
            crate::util::files::replace_private(
                &self.state_dir,
                SERIAL_FILE,
                file.serial.to_string().as_bytes(),
            )
            .map_err(|e| format!("cannot record the approvers file's serial: {e:#}"))?;
            *highest = file.serial;
        }
        Ok(file)
    }

    /// Records `approval_id` as executed here, durably before anything runs; refuses one
    /// executed before.
    fn first_execution(&self, approval_id: &str, expires: u64) -> Result<(), Refusal> {
        let mut executed = self.executed.lock().unwrap_or_else(|p| p.into_inner());
        if executed.contains_key(approval_id) {
            return Err(Refusal::Reused(format!(
                "approval {approval_id} was already executed on this runner: a signed approval is good for one execution"
            )));
        }
        let t = now();
        executed.retain(|_, e| *e > t);
        let append = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.state_dir)?;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.state_dir.join(EXECUTED_FILE))?;
            writeln!(f, "{approval_id} {expires}")?;
            f.sync_data()
        };
        append().map_err(|e| {
            format!("cannot record approval {approval_id} as executed ({e}); nothing was run")
        })?;
        executed.insert(approval_id.to_owned(), expires);
        Ok(())
    }

    /// Reads the executed ids (dropping expired ones, and rewriting the file without them)
    /// and the highest serial from `state_dir`.
    fn load_state(&self) -> anyhow::Result<()> {
        let path = self.state_dir.join(EXECUTED_FILE);
        let t = now();
        let mut executed = HashMap::new();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                for line in text.lines() {
                    let (id, exp) = line
                        .split_once(' ')
                        .and_then(|(id, e)| Some((id, e.parse::<u64>().ok()?)))
                        .with_context(|| format!("{}: malformed line `{line}`", path.display()))?;
                    if exp > t {
                        executed.insert(id.to_owned(), exp);
                    }
                }
                let kept: String = executed
                    .iter()
                    .map(|(id, e)| format!("{id} {e}\n"))
                    .collect();
                crate::util::files::replace_private(
                    &self.state_dir,
                    EXECUTED_FILE,
                    kept.as_bytes(),
                )?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
        *self.executed.lock().unwrap_or_else(|p| p.into_inner()) = executed;
        let serial_path = self.state_dir.join(SERIAL_FILE);
        match std::fs::read_to_string(&serial_path) {
            Ok(text) => {
                *self.serial.lock().unwrap_or_else(|p| p.into_inner()) = text
                    .trim()
                    .parse()
                    .with_context(|| format!("{}: not a number", serial_path.display()))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", serial_path.display())),
        }
        Ok(())
    }
}
