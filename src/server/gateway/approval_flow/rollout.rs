//! An approved request's rollout: its runners wave by wave, in the order of the plan fixed at
//! request time (and signed, where people sign). A wave's runners run at once, each its write
//! and then its health gate (the tool's `verify`, tried until it passes or its deadline runs
//! out); then the plan's pause; then the next wave. The last wave has no gate: nothing is left
//! to hold back, and its writes' answers are the outcome. The first failed write or gate
//! halts it: the runners of later waves are never called, and the audit log says which
//! runner failed, why, and which never ran. Under people's decision on a halt (`only`), the
//! runners it names run, each still in its wave.
//!
//! Invariant: a runner is called only in the wave the plan places it in (and the call says
//! which, so a runner that checks people's signatures holds it against the signed plan), and
//! only after every runner of every earlier wave wrote and passed its gate. Each wave of a
//! plan with several starts with a durable `rollout.wave` (the first one of an approved
//! request in its claim's commit, `execute.rs`; a plan of one wave is the request
//! `approval.executing` already names).

use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::super::dispatch::AuditedCall;
use super::super::outcome::{GATE_FAILED, NOT_RUN, RunnerResult};
use super::super::state::Gateway;
use crate::pack::ToolRef;
use crate::protocol::Mode;
use crate::protocol::approval::{ApprovalProof, Decision, DecisionProof, Plan};
use crate::protocol::witnessed::WitnessedApproval;
use crate::server::approvals::{Approval, Halt};
use crate::server::audit::kind;
use crate::server::runners::client::Dispatch;

/// How long a failed gate waits before it asks the runner again.
const GATE_RETRY: Duration = Duration::from_secs(1);

/// What every write of one approved request carries, prepared once.
pub(super) struct Prepared<'a> {
    pub(super) tool: &'a ToolRef,
    pub(super) audited: AuditedCall<'a>,
    pub(super) proof: Option<&'a ApprovalProof>,
    pub(super) witnessed: Option<&'a WitnessedApproval>,
    pub(super) secret_salt: Option<&'a str>,
    /// People's decision on the rollout's halt, when this run carries it out.
    pub(super) decision: Option<&'a DecisionProof>,
}

/// One write's rollout: the plan, the call its gates ask about, and its audit events.
pub(in crate::server::gateway) struct Rollout<'a> {
    pub(in crate::server::gateway) plan: &'a Plan,
    pub(in crate::server::gateway) tool: &'a ToolRef,
    pub(in crate::server::gateway) pack_sha256: &'a str,
    pub(in crate::server::gateway) args: &'a Map<String, Value>,
    pub(in crate::server::gateway) audited: &'a AuditedCall<'a>,
    /// Unix seconds from which no wave may start (a signed statement's expiry: its runners
    /// would refuse it).
    pub(in crate::server::gateway) no_wave_from: Option<u64>,
    /// The runners to run, when people's decision on a halted rollout runs some of them
    /// (each still in its wave of the plan); None: all of them.
    pub(in crate::server::gateway) only: Option<&'a [String]>,
    /// True when the first wave's `rollout.wave` is durable already (in the claim's commit).
    pub(in crate::server::gateway) first_wave_recorded: bool,
}

/// The actor of a rollout's own events.
pub(in crate::server::gateway) const ROLLOUT_ACTOR: &str = "system:rollout";

/// How a rollout ended.
pub(in crate::server::gateway) struct Rolled {
    /// Every runner's result, the ones never called included (`not_run`).
    pub(in crate::server::gateway) results: Vec<RunnerResult>,
    /// Why it stopped, when a write or a gate failed.
    pub(in crate::server::gateway) stopped: Option<String>,
    /// Where it halted, when runners of later waves never ran because of it.
    pub(in crate::server::gateway) halt: Option<Halt>,
}

impl Gateway {
    /// Runs an approved request's plan (see [`Gateway::roll_out`]); under people's decision
    /// on its halt, only the runners the decision names, until the decision expires.
    pub(super) async fn roll_out_approved(&self, row: &Approval, p: &Prepared<'_>) -> Rolled {
        let no_wave_from = match p.decision {
            Some(d) => Decision::parse(&d.text)
                .ok()
                .and_then(|d| d.expires_unix().ok()),
            None => row
                .statement
                .as_deref()
                .and_then(|text| crate::protocol::approval::Statement::parse(text).ok())
                .and_then(|st| st.expires_unix().ok()),
        };
        let decided = row.decision.as_ref().filter(|_| p.decision.is_some());
        let rollout = Rollout {
            plan: &row.plan,
            tool: p.tool,
            pack_sha256: &row.pack_sha256,
            args: &row.args,
            audited: &p.audited,
            no_wave_from,
            only: decided.map(|d| d.runners.as_slice()),
            // The claim of an approved request recorded its first wave (`execute.rs`).
            first_wave_recorded: decided.is_none(),
        };
        self.roll_out(&rollout, |name: String, wave| async move {
            self.write_on(row, p, &name, wave).await
        })
        .await
    }

    /// Runs a plan, wave by wave, halting at the first failed write or gate: `write` runs
    /// the tool on one runner in one wave (1-based) and records its outcome.
    pub(in crate::server::gateway) async fn roll_out<W, F>(
        &self,
        r: &Rollout<'_>,
        write: W,
    ) -> Rolled
    where
        W: Fn(String, u32) -> F,
        F: Future<Output = RunnerResult>,
    {
        let waves = waves_to_run(r.plan, r.only);
        let mut results = Vec::new();
        for (i, (wave, runners)) in waves.iter().enumerate() {
            if i > 0 && r.plan.pause_secs > 0 {
                tokio::time::sleep(Duration::from_secs(r.plan.pause_secs.into())).await;
            }
            let failed = match self.start_wave(r, i, *wave, runners).await {
                Err(why) => Some(Failure { runner: None, why }),
                Ok(()) => {
                    // The gate protects the waves still to come; after the last one there is
                    // nothing left to hold back, and the writes' answers are the outcome.
                    let gated = i + 1 < waves.len();
                    let (written, failed) = self.run_wave(r, *wave, runners, gated, &write).await;
                    results.extend(written);
                    failed
                }
            };
            if let Some(failure) = failed {
                let not_run = waves[i + 1..].iter().flat_map(|(_, run)| run).cloned();
                return self
                    .halt(r, *wave, failure, not_run.collect(), results)
                    .await;
            }
        }
        Rolled {
            results,
            stopped: None,
            halt: None,
        }
    }

    /// Whether the `i`th wave to run (wave `wave` of the plan) may start: not after the
    /// signed statement expired, and only once the audit log shows it (fail closed).
    async fn start_wave(
        &self,
        r: &Rollout<'_>,
        i: usize,
        wave: u32,
        runners: &[String],
    ) -> Result<(), String> {
        let total = r.plan.waves.len();
        if let Some(why) = too_late_for_wave(r.no_wave_from, wave) {
            return Err(why);
        }
        // One wave is the whole call, which its intent names already; the claim of an approved
        // request recorded its first wave: no second commit before the runner call.
        if total == 1 || (i == 0 && r.first_wave_recorded) {
            return Ok(());
        }
        let detail = json!({"wave": wave, "waves": total, "runners": runners});
        self.record_rollout(r.audited, kind::ROLLOUT_WAVE, None, detail)
            .await
            .map_err(|e| {
                format!("the audit log could not record wave {wave}, so it did not start: {e}")
            })
    }

    /// One wave's runners at once, each its write and then (when `gated`) its health gate:
    /// every result (a failed gate marks its runner unhealthy) and the wave's first failure,
    /// a failed write before a failed gate.
    async fn run_wave<W, F>(
        &self,
        r: &Rollout<'_>,
        wave: u32,
        runners: &[String],
        gated: bool,
        write: &W,
    ) -> (Vec<RunnerResult>, Option<Failure>)
    where
        W: Fn(String, u32) -> F,
        F: Future<Output = RunnerResult>,
    {
        // Each runner's gate follows its own write, so a wave takes its slowest runner's write
        // and gate, not the slowest write plus the slowest gate.
        let ran = futures::future::join_all(runners.iter().map(|name| {
            let written = write(name.clone(), wave);
            async move {
                let written = written.await;
                let gate = match gated && written.ok {
                    true => self.gate_one_of(r, name, wave).await,
                    false => Ok(()),
                };
                (written, gate)
            }
        }))
        .await;
        first_failure_marked(ran)
    }

    /// A failed wave: the runners of later waves (`not_run`) are never called; when there
    /// are any, the audit log says where it halted and why (nothing more runs either way, so
    /// a missing record is left to the server's log).
    async fn halt(
        &self,
        r: &Rollout<'_>,
        wave: u32,
        failure: Failure,
        not_run: Vec<String>,
        mut results: Vec<RunnerResult>,
    ) -> Rolled {
        let Failure { runner, why } = failure;
        let halted = !not_run.is_empty();
        let who = runner
            .as_deref()
            .map_or_else(String::new, |r| format!("runner `{r}`: "));
        let stopped = format!("wave {wave} of {}: {who}{why}", r.plan.waves.len());
        if halted {
            let detail = json!({"wave": wave, "runner": runner, "why": why, "not_run": not_run});
            let _ = self
                .record_rollout(r.audited, kind::ROLLOUT_HALTED, runner.as_deref(), detail)
                .await;
        }
        results.extend(not_run.iter().map(|name| not_run_result(name, &stopped)));
        Rolled {
            results,
            stopped: Some(stopped),
            halt: halted.then_some(Halt {
                wave,
                runner,
                not_run,
            }),
        }
    }

    /// One runner's write of an approved request, in its wave, with everything it carries.
    async fn write_on(
        &self,
        row: &Approval,
        p: &Prepared<'_>,
        name: &str,
        wave: u32,
    ) -> RunnerResult {
        let preview = row.preview_vars(name);
        let dispatch = Dispatch {
            preview: preview.as_ref().map(|(vars, _)| vars),
            preview_seal: preview.as_ref().and_then(|(_, seal)| seal.as_deref()),
            raw: row.raw,
            approval_id: Some(&row.id),
            approval: p.proof,
            witnessed: p.witnessed,
            secret_salt: p.secret_salt,
            wave: Some(wave),
            decision: p.decision,
            ..Dispatch::new(
                &row.call_id,
                &row.tool,
                &row.pack_sha256,
                &row.args,
                Mode::Execute,
            )
        };
        self.run_on(name, p.tool, &dispatch, &p.audited).await
    }

    /// One runner's health gate after its write: the tool's `verify` within its deadline,
    /// audited; a tool without one is gated on its write alone.
    async fn gate_one_of(&self, r: &Rollout<'_>, name: &str, wave: u32) -> Result<(), String> {
        match &r.tool.verify {
            Some(verify) => self.gate_one(r, name, wave, verify.within).await,
            None => Ok(()),
        }
    }

    /// One runner's gate: `verify` asked again every second until it passes or `within`
    /// runs out; one audit event with the outcome, the tries and what the runner saw.
    async fn gate_one(
        &self,
        r: &Rollout<'_>,
        name: &str,
        wave: u32,
        within: Duration,
    ) -> Result<(), String> {
        let started = Instant::now();
        let dispatch = Dispatch::new(
            r.audited.call_id,
            &r.tool.name,
            r.pack_sha256,
            r.args,
            Mode::Verify,
        );
        let mut tries = 0u32;
        let outcome = loop {
            tries += 1;
            let answer = self.dispatch_one(name, r.tool, &dispatch).await;
            let left = within.saturating_sub(started.elapsed());
            match answer {
                Ok(a) => break Ok(a.output),
                Err(e) if left.is_zero() => break Err(e.to_string()),
                Err(_) => tokio::time::sleep(GATE_RETRY.min(left)).await,
            }
        };
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let detail = match &outcome {
            Ok(seen) => {
                json!({"wave": wave, "passed": true, "tries": tries, "elapsed_ms": elapsed_ms,
                "saw": crate::util::input::for_audit(seen.get("steps").unwrap_or(&Value::Null))})
            }
            Err(why) => {
                tracing::warn!(runner = name, tool = %r.tool.name, call_id = r.audited.call_id,
                    wave, tries, error = %why, "a health gate did not pass: the rollout halts");
                json!({"wave": wave, "passed": false, "tries": tries, "elapsed_ms": elapsed_ms,
                "within_s": within.as_secs(), "error": why})
            }
        };
        // A gate the log cannot show does not pass.
        self.record_rollout(r.audited, kind::ROLLOUT_GATE, Some(name), detail)
            .await
            .map_err(|e| format!("the audit log could not record its health gate: {e}"))?;
        outcome.map(|_| ()).map_err(|why| {
            format!(
                "its health gate (`verify`) did not pass within {} s ({tries} tries): {why}",
                within.as_secs()
            )
        })
    }

    /// Audits one step of a rollout, durably, or says why it could not.
    async fn record_rollout(
        &self,
        audited: &AuditedCall<'_>,
        kind: &str,
        runner: Option<&str>,
        detail: Value,
    ) -> Result<(), String> {
        let event = audited.rollout_event(kind, runner, detail);
        self.audit.append(event).await.map(|_| ()).map_err(|e| {
            tracing::error!(error = %e, call_id = audited.call_id, kind, "could not audit a rollout step");
            "the store did not take the event (the server's log has the error)".to_owned()
        })
    }
}

/// Whether wave `wave` may no longer start, at or after `no_wave_from`, and why.
fn too_late_for_wave(no_wave_from: Option<u64>, wave: u32) -> Option<String> {
    let now = chrono::Utc::now().timestamp().max(0) as u64;
    (now >= no_wave_from?).then(|| {
        format!(
            "the signed statement expired before wave {wave} could start, so its runners would refuse it; ask again for the runners not run"
        )
    })
}

/// Why a wave failed: the runner whose write or gate failed (None: the wave never started).
struct Failure {
    runner: Option<String>,
    why: String,
}

/// The waves to run, each with its number in the plan (1-based) whichever of its runners run
/// now: all of them, or under people's decision on a halt only those it names (`only`); a
/// wave left with none is skipped.
fn waves_to_run(plan: &Plan, only: Option<&[String]>) -> Vec<(u32, Vec<String>)> {
    plan.waves
        .iter()
        .enumerate()
        .map(|(i, wave)| {
            let run = wave
                .iter()
                .filter(|n| only.is_none_or(|only| only.contains(n)))
                .cloned()
                .collect::<Vec<_>>();
            (i as u32 + 1, run)
        })
        .filter(|(_, run)| !run.is_empty())
        .collect()
}

/// A wave's writes and gates as results (a runner whose gate failed is marked unhealthy),
/// and its first failure: a failed write before a failed gate.
fn first_failure_marked(
    ran: Vec<(RunnerResult, Result<(), String>)>,
) -> (Vec<RunnerResult>, Option<Failure>) {
    let failed_write = ran.iter().find(|(w, _)| !w.ok).map(|(w, _)| Failure {
        runner: Some(w.runner.clone()),
        why: format!(
            "the write failed: {}",
            w.error.as_deref().unwrap_or("the write failed")
        ),
    });
    let failed_gate = ran.iter().find_map(|(w, gate)| {
        let why = gate.as_ref().err()?;
        Some(Failure {
            runner: Some(w.runner.clone()),
            why: why.clone(),
        })
    });
    let written = ran
        .into_iter()
        .map(|(mut w, gate)| {
            if let Err(why) = gate {
                mark_unhealthy(&mut w, &why);
            }
            w
        })
        .collect();
    (written, failed_write.or(failed_gate))
}

/// The result of a runner whose write ran and whose gate then failed: failed, with why, so
/// the agent reading the results alone does not take the node for healthy (its write's output
/// is kept).
fn mark_unhealthy(r: &mut RunnerResult, why: &str) {
    r.ok = false;
    r.error = Some(format!("the write ran, then {why}"));
    r.error_kind = Some(GATE_FAILED.into());
}

/// The result of a runner a halted rollout never called, with why it halted.
fn not_run_result(runner: &str, stopped: &str) -> RunnerResult {
    RunnerResult {
        runner: runner.to_owned(),
        ok: false,
        output: None,
        truncated: false,
        error: Some(format!(
            "not run: the rollout halted at {stopped}; nothing changed on this runner"
        )),
        error_kind: Some(NOT_RUN.into()),
        duration_ms: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    fn result(runner: &str, ok: bool) -> RunnerResult {
        RunnerResult {
            runner: runner.to_owned(),
            ok,
            output: None,
            truncated: false,
            error: (!ok).then(|| "exit 1".to_owned()),
            error_kind: None,
            duration_ms: 1,
        }
    }

    /// Each wave keeps its number in the plan; a decision's `only` runs just its runners, and
    /// a wave left with none is skipped rather than renumbered.
    #[test]
    fn waves_keep_their_numbers_and_only_runs_the_named_runners() {
        let plan = Plan {
            waves: vec![names(&["a"]), names(&["b", "c"]), names(&["d", "e"])],
            pause_secs: 0,
        };
        assert_eq!(
            waves_to_run(&plan, None),
            [
                (1, names(&["a"])),
                (2, names(&["b", "c"])),
                (3, names(&["d", "e"]))
            ]
        );
        let only = names(&["c", "e"]);
        assert_eq!(
            waves_to_run(&plan, Some(&only)),
            [(2, names(&["c"])), (3, names(&["e"]))]
        );
        assert!(waves_to_run(&plan, Some(&[])).is_empty());
    }

    /// A failed write names its runner before any failed gate; a failed gate marks its
    /// runner's result failed (`gate_failed`) and keeps the write's output.
    #[test]
    fn a_wave_fails_at_its_first_failed_write_then_at_a_failed_gate() {
        let (written, failed) = first_failure_marked(vec![
            (
                result("a", true),
                Err("its health gate did not pass".into()),
            ),
            (result("b", false), Ok(())),
        ]);
        let failed = failed.unwrap();
        assert_eq!(failed.runner.as_deref(), Some("b"));
        assert_eq!(failed.why, "the write failed: exit 1");
        assert!(!written[0].ok);
        assert_eq!(written[0].error_kind.as_deref(), Some(GATE_FAILED));

        let (written, failed) = first_failure_marked(vec![
            (result("a", true), Ok(())),
            (result("b", true), Err("gate b".into())),
        ]);
        let failed = failed.unwrap();
        assert_eq!(
            (failed.runner.as_deref(), failed.why.as_str()),
            (Some("b"), "gate b")
        );
        assert!(written[0].ok && !written[1].ok);

        let (written, failed) = first_failure_marked(vec![(result("a", true), Ok(()))]);
        assert!(failed.is_none() && written[0].ok);
    }

    /// A statement that expired keeps every later wave from starting, with why.
    #[test]
    fn no_wave_starts_at_or_after_the_statements_expiry() {
        let now = chrono::Utc::now().timestamp() as u64;
        assert!(too_late_for_wave(None, 2).is_none());
        assert!(too_late_for_wave(Some(now + 3600), 2).is_none());
        let why = too_late_for_wave(Some(now), 2).unwrap();
        assert!(why.contains("expired before wave 2"), "{why}");
    }
}
