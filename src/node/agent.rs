//! `emisar runner`: the per-node HTTP server that executes signed calls.
//!
//! Order of checks for `POST /v1/call`, each refusing with a clear error before anything runs:
//! signature, audience, expiry and lifetime → single-use id → the token matches this request
//! (tool, argument digest) → the tool is in this runner's own packs with the same pack digest
//! → the arguments validate against this runner's own schema → every allowlisted value is in
//! this runner's allowlist → an execution's preview values are ones the tool's preview
//! captures, none named like a param, under this runner's own seal for this call and these
//! arguments → an execution of a risk:high tool carries an approval id never used before, or
//! the policy's lowering, or a grant this runner finds good and has uses left here
//! ([`super::grants`]). Only then does the action run. A preview's answer carries the seal
//! over what it captured.
//!
//! `GET /healthz` answers liveness (`{"status": "ok"}`) to anyone, and this runner's details
//! (name, pack digests, allowlists) only with a health token the server signed for this
//! runner (its purpose `health`, see [`crate::protocol::signing`]): they tell a stranger which
//! packs to pretend to serve and which values would run here.
//!
//! `POST /v1/grants/revoked` takes a revocation token the server signed for this runner (its
//! purpose `revoke`) and hands the grants it names to [`super::grants::record_revoked`].
//!
//! *Invariant:* `grants` and `refusal` import nothing of this module: [`grants::check`] reads
//! the runner through the view [`grants::Node`] this module builds, so the runner's modules
//! form a tree with this one above them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::approvals::{Gate, GateConfig};
use super::engine::{self, Env};
use super::executed::Executed;
use super::grants;
use super::refusal::{Refused, bearer, forbidden, ledger_refusal, refuse};
use super::seal::{SealKey, Sealed};
use crate::node::config::RunnerConfig;
use crate::pack::{PackInfo, PackSet, Risk, Tool, ToolRef, allowlist_admits, shown_value};
use crate::protocol::approval::RunnerApprovals;
use crate::protocol::signing::{CallClaims, CallVerifier, now};
use crate::protocol::witnessed::{WitnessTrust, WitnessedApproval};
use crate::protocol::{CallRequest, CallResponse, Mode};

/// The most single-use ids remembered at once. Ids are forgotten when their token expires,
/// so this bounds memory under a flood of valid calls; past it, calls are refused.
const MAX_SEEN_IDS: usize = 100_000;
/// How long an executed approval id is remembered, at least (longer when its expiry is later).
/// Approvals expire long before this (their default lifetime is 15 minutes), so a remembered
/// id can never be approved again; and a rollout decision on an approval requested longer ago
/// than this is refused, since the memory of what ran may be gone.
const APPROVAL_MEMORY_SECS: u64 = 24 * 3600;

pub struct RunnerState {
    config: RunnerConfig,
    packs: PackSet,
    verifier: CallVerifier,
    /// Single-use ids seen, with the expiry of their token.
    seen: Mutex<HashMap<String, u64>>,
    /// Approval ids already executed here, kept in `state_dir`, and when that state began.
    executed: Executed,
    /// Seals what previews capture, so an execution runs only with values this runner made.
    seal_key: SealKey,
    /// `require_witnessed`: the keys a write's witnessed approval is checked against.
    witnessed: Option<WitnessTrust>,
    /// People's signatures required before a write runs (`require_signed_approvals`).
    gate: Gate,
    http: reqwest::Client,
}

impl RunnerState {
    /// A runner that verifies calls with the key in `server_public_key_file`.
    pub fn new(config: RunnerConfig) -> anyhow::Result<Arc<Self>> {
        use anyhow::Context;
        let path = config
            .server_public_key_file
            .clone()
            .context("no server_public_key_file configured")?;
        let pem = std::fs::read_to_string(&path)
            .with_context(|| format!("failed to read server public key {}", path.display()))?;
        Self::with_key(config, &pem)
    }

    /// A runner that verifies calls with `server_public_key` (SPKI PEM).
    pub fn with_key(config: RunnerConfig, server_public_key: &str) -> anyhow::Result<Arc<Self>> {
        let packs = PackSet::load(config.packs_dir.as_deref())?;
        Self::with_key_and_packs(config, server_public_key, packs)
    }

    /// Like [`RunnerState::with_key`], with the packs already loaded (a joining runner loads
    /// them first, to announce them).
    pub fn with_key_and_packs(
        config: RunnerConfig,
        server_public_key: &str,
        packs: PackSet,
    ) -> anyhow::Result<Arc<Self>> {
        config.check_services(&packs)?;
        let gate = gate(&config)?;
        let executed = Executed::load(&config.state_dir)?;
        let witnessed = witness_trust(&config)?;
        let pem = server_public_key;
        let verifier = CallVerifier::from_pem(pem, &config.name)?;
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(3))
            // Local services only: never follow a redirect somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()?;
        Ok(Arc::new(RunnerState {
            config,
            packs,
            verifier,
            seen: Mutex::new(HashMap::new()),
            executed,
            seal_key: SealKey::generate()?,
            gate,
            witnessed,
            http,
        }))
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Pack name → digest, as this runner loaded them.
    pub fn pack_digests(&self) -> std::collections::BTreeMap<String, String> {
        self.packs
            .packs()
            .map(|p| (p.name.clone(), p.digest.clone()))
            .collect()
    }

    /// What [`grants::check`] reads of this runner: its config, its gate, its ledger and
    /// whether it requires witnessed approvals.
    fn grant_view(&self) -> grants::Node<'_> {
        grants::Node {
            config: &self.config,
            gate: &self.gate,
            executed: &self.executed,
            requires_witnessed: self.witnessed.is_some(),
        }
    }

    /// Records `jti` as used; false if it was seen before (or the table is full).
    fn first_use(&self, jti: &str, exp: u64) -> Result<(), &'static str> {
        Self::remember(&self.seen, jti, exp, "this call token was already used")
    }

    /// One bounded set of used ids, each forgotten after its expiry.
    fn remember(
        table: &Mutex<HashMap<String, u64>>,
        id: &str,
        exp: u64,
        used: &'static str,
    ) -> Result<(), &'static str> {
        let mut seen = table.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains_key(id) {
            return Err(used);
        }
        if seen.len() >= MAX_SEEN_IDS {
            let t = now();
            seen.retain(|_, e| *e + 10 >= t);
            if seen.len() >= MAX_SEEN_IDS {
                return Err("too many calls in flight: try again shortly");
            }
        }
        seen.insert(id.to_owned(), exp);
        Ok(())
    }
}

pub fn router(state: Arc<RunnerState>) -> Router {
    Router::new()
        .route("/v1/call", post(call))
        .route("/v1/grants/revoked", post(revoked))
        .route("/healthz", get(health))
        .with_state(state)
}

/// Serves until `shutdown` is cancelled. The caller binds the listener (tests use port 0).
pub async fn run(
    listener: TcpListener,
    state: Arc<RunnerState>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    tracing::info!(runner = state.name(), addr = %listener.local_addr()?, "runner listening (plain HTTP)");
    axum::serve(crate::util::net::without_nagle(listener), router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Serves signed calls over HTTPS with `tls` on an already-bound listener until `shutdown`.
pub async fn run_https(
    listener: TcpListener,
    state: Arc<RunnerState>,
    tls: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    tracing::info!(runner = state.name(), addr = %listener.local_addr()?, "runner listening (HTTPS)");
    crate::util::tls::serve_https(listener, router(state), tls, shutdown).await
}

async fn health(State(state): State<Arc<RunnerState>>, headers: HeaderMap) -> Response {
    let Some(token) = bearer(&headers) else {
        // Liveness, for load balancers, orchestrators and scripts that wait for a start.
        return Json(json!({"status": "ok"})).into_response();
    };
    // A token that does not verify is refused rather than answered as liveness: the server's
    // prober then shows the runner unhealthy, which a key it cannot verify calls with is.
    if let Err(e) = state.verifier.verify_health(token) {
        tracing::warn!(error = %e, "health details refused");
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": format!("health details refused: {e}")})),
        )
            .into_response();
    }
    let packs: serde_json::Map<String, Value> = state
        .packs
        .packs()
        .map(|p| (p.name.clone(), json!(p.digest)))
        .collect();
    // The allowlists go out with the packs so the server can refuse a value that can never
    // run here before it asks anyone to approve it; this runner still checks every call.
    Json(json!({
        "status": "ok",
        "name": state.config.name,
        "packs": packs,
        "allowlists": state.config.allowlists,
        "approvals": RunnerApprovals {
            require_witnessed: state.witnessed.is_some(),
            max_approval_lifetime_secs: Some(state.config.max_approval_lifetime_secs),
            ..state.gate.report()
        },
    }))
    .into_response()
}

/// `POST /v1/grants/revoked`: a revocation token signed by the server for this runner; each
/// grant it names is recorded as revoked here ([`grants::record_revoked`]).
async fn revoked(State(state): State<Arc<RunnerState>>, headers: HeaderMap) -> Response {
    let Some(token) = bearer(&headers) else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "a signed revocation token is required",
        );
    };
    let claims = match state.verifier.verify_revoke(token) {
        Ok(claims) => claims,
        Err(e) => return refuse(StatusCode::UNAUTHORIZED, e.to_string()),
    };
    match grants::record_revoked(
        &state.executed,
        state.config.max_grant_lifetime_secs,
        &claims.grants,
    ) {
        Ok(told) => {
            Json(json!({"revoked": told.recorded, "already_expired": told.expired})).into_response()
        }
        Err((status, why)) => refuse(status, why),
    }
}

/// A call that passed every check, ready to run.
struct Admitted<'s> {
    claims: CallClaims,
    request: CallRequest,
    tool: &'s ToolRef,
    pack: &'s PackInfo,
}

async fn call(
    State(state): State<Arc<RunnerState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(token) = bearer(&headers) else {
        return refuse(StatusCode::UNAUTHORIZED, "a signed call token is required");
    };
    match admit(&state, token, &body) {
        Ok(call) => execute(&state, call).await,
        Err((status, why)) => refuse(status, why),
    }
}

/// Every check a call passes before anything runs, in the order the module doc gives; the
/// first that fails refuses it.
fn admit<'s>(state: &'s RunnerState, token: &str, body: &[u8]) -> Result<Admitted<'s>, Refused> {
    let claims = state
        .verifier
        .verify(token)
        .map_err(|e| (StatusCode::UNAUTHORIZED, e.to_string()))?;
    state
        .first_use(&claims.jti, claims.exp)
        .map_err(|why| (StatusCode::CONFLICT, why.to_owned()))?;
    let request: CallRequest = serde_json::from_slice(body)
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("invalid call body: {e}")))?;
    check_signed_for(&claims, &request)?;
    let Some(tool) = state.packs.tool(&request.tool) else {
        return Err((
            StatusCode::NOT_FOUND,
            format!("unknown tool `{}` on this runner", request.tool),
        ));
    };
    let pack = state
        .packs
        .pack(&tool.pack)
        .expect("every tool has its pack");
    check_same_pack(pack, &claims)?;
    check_args(tool, &request, &state.config.allowlists)?;
    check_preview_values(&state.seal_key, &state.config.name, tool, &claims, &request)
        .map_err(|why| (StatusCode::FORBIDDEN, why))?;
    check_high_risk(state, tool, &claims, &request)?;
    Ok(Admitted {
        claims,
        request,
        tool,
        pack,
    })
}

/// The token was signed for this very request: its tool and the digest of its whole body.
fn check_signed_for(claims: &CallClaims, request: &CallRequest) -> Result<(), Refused> {
    if claims.tool != request.tool || claims.request_sha256 != request.digest() {
        return Err((
            StatusCode::UNAUTHORIZED,
            "the call token was signed for another tool or another request".into(),
        ));
    }
    Ok(())
}

/// The server resolved the tool from the same pack file this runner loaded.
fn check_same_pack(pack: &PackInfo, claims: &CallClaims) -> Result<(), Refused> {
    if pack.digest != claims.pack_sha256 {
        return Err((
            StatusCode::CONFLICT,
            format!(
                "pack `{}` differs between server ({}) and runner ({}): deploy the same packs to both",
                pack.name, claims.pack_sha256, pack.digest
            ),
        ));
    }
    Ok(())
}

/// The arguments validate against this runner's own schema of the tool, and every value of a
/// param with an allowlist is in this runner's list of that name (a list it lacks admits
/// nothing).
fn check_args(
    tool: &Tool,
    request: &CallRequest,
    allowlists: &BTreeMap<String, Vec<String>>,
) -> Result<(), Refused> {
    let args = Value::Object(request.args.clone());
    if let Err(errors) = tool.validate(&args) {
        return Err((
            StatusCode::BAD_REQUEST,
            format!(
                "invalid arguments for `{}`: {}",
                tool.name,
                errors.join("; ")
            ),
        ));
    }
    for param in tool.params.iter() {
        // Every value is checked, whatever its type: a list on a number holds for numbers.
        let (Some(list_name), Some(value)) = (&param.allowlist, request.args.get(&param.name))
        else {
            continue;
        };
        let allowed = allowlists
            .get(list_name)
            .is_some_and(|list| allowlist_admits(&param.kind, value, list));
        if !allowed {
            let shown = shown_value(param, value);
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "`{}` = {shown} is not in this runner's allowlist `{list_name}` ([allowlists] in runner.toml); nothing was run",
                    param.name
                ),
            ));
        }
    }
    Ok(())
}

/// Runs an admitted call and answers with its outcome; a preview's answer carries this
/// runner's seal over what it captured.
async fn execute(state: &RunnerState, call: Admitted<'_>) -> Response {
    let Admitted {
        claims,
        request,
        tool,
        pack,
    } = call;
    tracing::info!(tool = %tool.name, call_id = %claims.call_id, approval_id = ?claims.approval_id, mode = ?request.mode, "executing");
    let started = Instant::now();
    let service = pack
        .service
        .as_deref()
        .and_then(|name| state.config.services.get(name).map(|s| (name, s)));
    let env = Env {
        service,
        exec_path: &state.config.exec_path,
        programs: &state.config.programs,
        max_output: state.config.max_output_bytes,
    };
    let outcome = engine::run(
        &engine::Live { http: &state.http },
        &env,
        tool,
        &request.args,
        request.mode,
        request.preview.as_ref(),
        request.raw,
    )
    .await;
    let duration_ms = started.elapsed().as_millis() as u64;
    let response = match outcome {
        Ok(o) => {
            // A preview that captures no values only shows: there is nothing to seal, and its
            // execution brings nothing back.
            let seal = (request.mode == Mode::Preview && tool.needs_preview_values()).then(|| {
                state.seal_key.seal(&Sealed {
                    runner: &state.config.name,
                    call_id: &claims.call_id,
                    tool: &tool.name,
                    pack_sha256: &claims.pack_sha256,
                    args: &request.args,
                    vars: &o.vars,
                })
            });
            CallResponse::Ok {
                output: o.output,
                truncated: o.truncated,
                duration_ms,
                vars: o.vars,
                seal,
            }
        }
        Err(error) => CallResponse::Failed { error, duration_ms },
    };
    Json(response).into_response()
}

/// An execution of a risk:high tool carries an approval id never executed here, or the
/// policy's lowering; where this runner requires a witnessed approval, its proof bound to this
/// very call; and where it requires people's signatures for the tool, the gate's check of them
/// (which also decides whether a lowering may run here). The approval id is recorded as
/// executed in `state_dir`, durably, once everything holds and before anything runs.
fn check_high_risk(
    state: &RunnerState,
    tool: &Tool,
    claims: &CallClaims,
    request: &CallRequest,
) -> Result<(), Refused> {
    if tool.risk != Risk::High || request.mode != Mode::Execute {
        return Ok(());
    }
    if let Some(proof) = &request.grant {
        return grants::check(&state.grant_view(), tool, claims, request, proof);
    }
    let secret: Vec<&str> = tool.secret_params().collect();
    // When the approval stops mattering here: the latest expiry a check found, else a day.
    let mut keep_until = None;
    if let Some(trust) = &state.witnessed {
        keep_until = Some(check_witnessed(
            state, trust, tool, claims, request, &secret,
        )?);
    }
    if state.gate.requires(&tool.name) {
        match check_signatures(state, tool, claims, request, &secret)? {
            Some(expires) => keep_until = keep_until.max(Some(expires)),
            // A lowering this runner's approvers file allows unapproved: nothing to record.
            None => return Ok(()),
        }
    }
    match (
        claims.approval_id.as_deref(),
        claims.lowered_by_policy.as_deref(),
    ) {
        (Some(approval_id), _) => record_executed(state, approval_id, request, keep_until),
        (None, Some(policy)) => {
            // The server's policy says this tool runs without a human; the log names the
            // policy, which the server's audit log holds as `policy.loaded`.
            tracing::warn!(tool = %tool.name, call_id = %claims.call_id, policy_sha256 = %policy,
                "executing a risk:high tool without approval: the server's policy lowered it");
            Ok(())
        }
        (None, None) => Err(forbidden(format!(
            "`{}` is risk:high: this runner executes it only under a human's approval or the server policy's lowering, and the call carries neither",
            tool.name
        ))),
    }
}

/// Where this runner requires witnessed approvals (`trust`): the call's approval is in the
/// audit log as witnessed, bound to this very call (its arguments digested with the tool's
/// `secret` params as commitments), and requested no earlier than this runner's ledger of
/// executed approvals began. Returns when the approval expires.
fn check_witnessed(
    state: &RunnerState,
    trust: &WitnessTrust,
    tool: &Tool,
    claims: &CallClaims,
    request: &CallRequest,
    secret: &[&str],
) -> Result<u64, Refused> {
    let (approval_id, witnessed) = witnessed_approval(tool, claims, request, trust.quorum)?;
    let refused = |why: String| {
        forbidden(format!(
            "approval {approval_id}: the witnessed proof is refused: {why}"
        ))
    };
    let args_sha256 = crate::protocol::approval::statement::args_digest(
        &request.args,
        secret,
        request.secret_salt.as_deref(),
    )
    .map_err(|e| refused(e.to_string()))?;
    let preview_sha256 = request
        .preview
        .as_ref()
        .map(|p| crate::digest::json_digest(&Value::Object(p.clone())));
    let call = crate::protocol::witnessed::Call {
        runner: &state.config.name,
        approval_id,
        tool: &tool.name,
        pack_sha256: &claims.pack_sha256,
        args_sha256: &args_sha256,
        preview_sha256: preview_sha256.as_deref(),
    };
    let verified = crate::protocol::witnessed::verify(
        witnessed,
        &call,
        trust,
        now(),
        state.config.max_approval_lifetime_secs,
    )
    .map_err(refused)?;
    state
        .executed
        .check_requested(&format!("approval {approval_id}"), verified.requested)
        .map_err(refused)?;
    tracing::info!(tool = %tool.name, %approval_id, event_seq = witnessed.event.seq, cosigned_by = ?verified.cosigned,
        "the approval is in the audit log as witnessed, bound to this call");
    Ok(verified.expires)
}

/// The approval id and its witnessed proof (in a checkpoint cosigned by `quorum` witnesses),
/// both of which an execution of risk:high `tool` carries on a runner that requires witnessed
/// approvals.
fn witnessed_approval<'c>(
    tool: &Tool,
    claims: &'c CallClaims,
    request: &'c CallRequest,
    quorum: usize,
) -> Result<(&'c str, &'c WitnessedApproval), Refused> {
    let Some(approval_id) = claims.approval_id.as_deref() else {
        return Err(forbidden(format!(
            "`{}` is risk:high and this runner requires witnessed approvals: the call carries no approval",
            tool.name
        )));
    };
    let Some(witnessed) = &request.witnessed else {
        return Err(forbidden(format!(
            "approval {approval_id}: this runner requires a witnessed approval (its approval.approved event in a checkpoint cosigned by {quorum} witnesses), and the call carries none"
        )));
    };
    Ok((approval_id, witnessed))
}

/// Where this runner requires people's signatures for `tool`: the gate's check of them.
/// Returns when their statement expires, or `None` for a policy's lowering this runner's
/// approvers file allows unapproved.
fn check_signatures(
    state: &RunnerState,
    tool: &Tool,
    claims: &CallClaims,
    request: &CallRequest,
    secret: &[&str],
) -> Result<Option<u64>, Refused> {
    let checked = state
        .gate
        .check(&state.config.name, claims, request, secret, &state.executed)
        .map_err(forbidden)?;
    match &checked.signed {
        Some(signed) => {
            let people: Vec<&str> = signed.iter().map(|s| s.person.as_str()).collect();
            tracing::info!(tool = %tool.name, call_id = %claims.call_id, approval_id = ?claims.approval_id, signed_by = ?people,
                "executing a risk:high tool under people's signatures checked here");
            Ok(Some(checked.expires))
        }
        None => {
            tracing::warn!(tool = %tool.name, call_id = %claims.call_id, policy_sha256 = ?claims.lowered_by_policy,
                "executing a risk:high tool without approval: the server's policy lowered it and this runner's approvers file allows it unapproved");
            Ok(None)
        }
    }
}

/// Records approval `approval_id` as executed here, durably, under each of its ledger keys
/// ([`ledger_keys`]), before anything runs: a key recorded before refuses the call.
fn record_executed(
    state: &RunnerState,
    approval_id: &str,
    request: &CallRequest,
    keep_until: Option<u64>,
) -> Result<(), Refused> {
    let keep = remembered_until(keep_until, now());
    // The decision's key first: it is the one a replay of the decision meets.
    for key in ledger_keys(state, approval_id, request).map_err(forbidden)? {
        state.executed.record(&key, keep).map_err(ledger_refusal)?;
    }
    Ok(())
}

/// Until when an executed approval is remembered: its latest expiry a check found
/// (`keep_until`), and a day from `now` at least, whatever the expiry: a decision on a halted
/// rollout may come after it (and is refused once this memory may be gone).
fn remembered_until(keep_until: Option<u64>, now: u64) -> u64 {
    keep_until.unwrap_or(0).max(now + APPROVAL_MEMORY_SECS)
}

/// What the ledger records for this execution, each once: the approval id; under people's
/// decision on a halted rollout, the decision's id first (`decision:ID`: a decision runs a
/// runner at most once), and the approval id only if it never ran here. A second run of the
/// approval here needs a retry, and only for a runner of the wave it halted in (the signed
/// plan's wave, which the call carries and a runner that checks signatures has held it to): a
/// retry lets the runner that failed run again, never one of a wave that ran and passed. A
/// decision that does not name this runner lets nothing run. (A runner that checks signatures
/// has verified the decision's people already; this holds for every runner.)
fn ledger_keys(
    state: &RunnerState,
    approval_id: &str,
    request: &CallRequest,
) -> Result<Vec<String>, String> {
    use crate::protocol::approval::{Choice, Decision};
    let Some(proof) = &request.decision else {
        return Ok(vec![approval_id.to_owned()]);
    };
    let decision = Decision::parse(&proof.text).map_err(|e| e.to_string())?;
    let runner = &state.config.name;
    // This runner remembers what it executed for APPROVAL_MEMORY_SECS: past that, it could no
    // longer tell a resume from a second run.
    let requested = crate::protocol::approval::issued_millis(approval_id).map(|ms| ms / 1000);
    if requested.is_none_or(|at| now() > at + APPROVAL_MEMORY_SECS) {
        return Err(format!(
            "approval {approval_id} was requested more than {} h ago (or its id is not a UUIDv7): this runner remembers its executions that long, so no rollout decision on it runs here; ask again",
            APPROVAL_MEMORY_SECS / 3600
        ));
    }
    if decision.approval_id != approval_id || !decision.runners.iter().any(|r| r == runner) {
        return Err(format!(
            "the rollout decision {} does not let approval {approval_id} run on this runner (`{runner}`)",
            decision.id
        ));
    }
    let key = format!("decision:{}", decision.id);
    if !state.executed.contains(approval_id) {
        return Ok(vec![key, approval_id.to_owned()]);
    }
    match decision.choice {
        Choice::Retry if request.wave == Some(decision.halted_wave) => Ok(vec![key]),
        Choice::Retry => Err(format!(
            "approval {approval_id} was already executed on this runner, and the retry {} runs again only the runner that failed, in wave {} where the rollout halted; this call runs in {}",
            decision.id,
            decision.halted_wave,
            request
                .wave
                .map_or_else(|| "no wave".to_owned(), |w| format!("wave {w}"))
        )),
        Choice::Resume | Choice::Abort => Err(format!(
            "approval {approval_id} was already executed on this runner, and the rollout decision {} is a {}, not a retry: it never runs a runner twice",
            decision.id,
            decision.choice.as_str()
        )),
    }
}

/// The preview values an execution brings must be ones the tool's preview captures, never
/// named like a param (a value would stand in for the approved argument in a template), and
/// exactly the ones this runner sealed for this call and these arguments.
fn check_preview_values(
    seal_key: &SealKey,
    runner: &str,
    tool: &Tool,
    claims: &CallClaims,
    request: &CallRequest,
) -> Result<(), String> {
    let given = match (request.mode, &request.preview) {
        (_, None) => return Ok(()),
        (Mode::Preview | Mode::Verify, Some(_)) => {
            return Err(
                "a preview or verify call carries no preview values; nothing was run".into(),
            );
        }
        (Mode::Execute, Some(given)) => given,
    };
    let Some(preview) = &tool.preview else {
        return Err(format!(
            "`{}` has no preview, so its execution takes no preview values; nothing was run",
            tool.name
        ));
    };
    for name in given.keys() {
        if tool.params.iter().any(|p| &p.name == name) {
            return Err(format!(
                "the preview value `{name}` is named like a param of `{}`: a preview value never stands in for an argument; nothing was run",
                tool.name
            ));
        }
        if !preview.vars.contains(name) {
            return Err(format!(
                "the preview value `{name}` is not one the preview of `{}` captures (it captures: {}); nothing was run",
                tool.name,
                preview.vars.join(", ")
            ));
        }
    }
    let sealed = Sealed {
        runner,
        call_id: &claims.call_id,
        tool: &tool.name,
        pack_sha256: &claims.pack_sha256,
        args: &request.args,
        vars: given,
    };
    match &request.preview_seal {
        Some(seal) if seal_key.verify(&sealed, seal) => Ok(()),
        Some(_) => Err(
            "the preview values differ from the ones this runner sealed at request time for this call and these arguments (changed on the way, or sealed before this runner restarted); nothing was run: request the change again".into(),
        ),
        None => Err(
            "the preview values carry no seal from this runner; nothing was run: request the change again".into(),
        ),
    }
}

/// The gate of `require_signed_approvals` from runner.toml (reads its files and the serial kept
/// in `state_dir`; writes nothing).
fn gate(config: &RunnerConfig) -> anyhow::Result<Gate> {
    Gate::load(GateConfig {
        require_signed_approvals: &config.require_signed_approvals,
        approvers_file: config.approvers_file.as_deref(),
        approvers_root_keys: &config.approvers_root_keys,
        min_approvers_serial: config.min_approvers_serial,
        max_approval_lifetime_secs: config.max_approval_lifetime_secs,
        state_dir: &config.state_dir,
    })
}

/// The checks a runner's start makes on its approvals settings (the approvers file and root
/// keys, the witnesses), without starting or writing anything: `emisar config check` runs
/// these very checks.
pub fn check_approvals(config: &RunnerConfig) -> anyhow::Result<()> {
    gate(config)?;
    witness_trust(config)?;
    Ok(())
}

/// `require_witnessed`'s keys from runner.toml, each bad one named.
fn witness_trust(config: &RunnerConfig) -> anyhow::Result<Option<WitnessTrust>> {
    if !config.require_witnessed {
        return Ok(None);
    }
    let log_key = config.log_key.as_deref().ok_or_else(|| {
        anyhow::anyhow!("require_witnessed = true needs log_key: the audit log's verifier key")
    })?;
    if config.witness_keys.is_empty() {
        anyhow::bail!("require_witnessed = true needs witness_keys: the witnesses' verifier keys");
    }
    let quorum = config.witness_quorum.unwrap_or(config.witness_keys.len());
    WitnessTrust::new(log_key, &config.witness_keys, quorum)
        .map(Some)
        .map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use serde_json::Map;

    use super::*;
    use crate::protocol::signing::{CallSigner, ISSUER, Purpose, TOKEN_LIFETIME, generate_keypair};

    /// A runner named `edge1` on the stock packs, and the server's signer it trusts.
    struct Fixture {
        state: Arc<RunnerState>,
        signer: CallSigner,
        _dir: tempfile::TempDir,
    }

    fn runner(tweak: impl FnOnce(&mut RunnerConfig)) -> Fixture {
        let (private, public) = generate_keypair().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut config = RunnerConfig::with_name("edge1");
        config.state_dir = dir.path().to_owned();
        tweak(&mut config);
        Fixture {
            state: RunnerState::with_key(config, &public).unwrap(),
            signer: CallSigner::from_pem(&private).unwrap(),
            _dir: dir,
        }
    }

    fn request(tool: &str, args: Value, mode: Mode) -> CallRequest {
        CallRequest {
            tool: tool.into(),
            args: args.as_object().unwrap().clone(),
            mode,
            preview: None,
            preview_seal: None,
            raw: false,
            approval: None,
            witnessed: None,
            secret_salt: None,
            wave: None,
            decision: None,
            grant: None,
        }
    }

    impl Fixture {
        /// The claims the server signs for `request`, with this runner's pack digest.
        fn claims(&self, request: &CallRequest) -> CallClaims {
            let pack = self
                .state
                .packs
                .tool(&request.tool)
                .map(|t| self.state.packs.pack(&t.pack).unwrap().digest.clone())
                .unwrap_or_default();
            let iat = now();
            CallClaims {
                iss: ISSUER.into(),
                aud: "edge1".into(),
                iat,
                exp: iat + TOKEN_LIFETIME,
                purpose: Purpose::Call,
                jti: uuid::Uuid::new_v4().to_string(),
                call_id: "c1".into(),
                tool: request.tool.clone(),
                request_sha256: request.digest(),
                pack_sha256: pack,
                approval_id: None,
                lowered_by_policy: None,
            }
        }

        /// `admit` of `request` under `claims`: Ok, or the refusal's status and reason.
        fn admit_with(&self, claims: &CallClaims, request: &CallRequest) -> Result<(), Refused> {
            let token = self.signer.sign(claims).unwrap();
            let body = serde_json::to_vec(request).unwrap();
            admit(&self.state, &token, &body).map(|_| ())
        }

        fn admit(&self, request: &CallRequest) -> Result<(), Refused> {
            self.admit_with(&self.claims(request), request)
        }

        /// The seal a preview of `request` on this runner gives `vars`.
        fn seal(
            &self,
            claims: &CallClaims,
            request: &CallRequest,
            vars: &Map<String, Value>,
        ) -> String {
            self.state.seal_key.seal(&Sealed {
                runner: "edge1",
                call_id: &claims.call_id,
                tool: &request.tool,
                pack_sha256: &claims.pack_sha256,
                args: &request.args,
                vars,
            })
        }
    }

    fn refused(result: Result<(), Refused>, status: StatusCode, part: &str) {
        let (got, why) = result.expect_err("the call was admitted");
        assert_eq!(got, status, "{why}");
        assert!(why.contains(part), "want `{part}` in `{why}`");
    }

    fn members() -> CallRequest {
        request("consul.members", json!({}), Mode::Execute)
    }

    #[test]
    fn a_token_must_be_signed_by_the_server_for_this_runner() {
        let f = runner(|_| {});
        assert!(f.admit(&members()).is_ok());
        let stranger = runner(|_| {});
        let claims = f.claims(&members());
        let token = stranger.signer.sign(&claims).unwrap();
        let body = serde_json::to_vec(&members()).unwrap();
        refused(
            admit(&f.state, &token, &body).map(|_| ()),
            StatusCode::UNAUTHORIZED,
            "the token is invalid",
        );
        let elsewhere = CallClaims {
            aud: "edge2".into(),
            ..f.claims(&members())
        };
        refused(
            f.admit_with(&elsewhere, &members()),
            StatusCode::UNAUTHORIZED,
            "the token is invalid",
        );
    }

    #[test]
    fn a_token_runs_once() {
        let f = runner(|_| {});
        let claims = f.claims(&members());
        assert!(f.admit_with(&claims, &members()).is_ok());
        refused(
            f.admit_with(&claims, &members()),
            StatusCode::CONFLICT,
            "this call token was already used",
        );
    }

    #[test]
    fn the_token_is_for_this_very_request() {
        let f = runner(|_| {});
        let token = f.signer.sign(&f.claims(&members())).unwrap();
        refused(
            admit(&f.state, &token, b"{not json").map(|_| ()),
            StatusCode::BAD_REQUEST,
            "invalid call body",
        );
        let other = request("consul.catalog_services", json!({}), Mode::Execute);
        refused(
            f.admit_with(&f.claims(&members()), &other),
            StatusCode::UNAUTHORIZED,
            "signed for another tool or another request",
        );
        let raw = CallRequest {
            raw: true,
            ..members()
        };
        refused(
            f.admit_with(&f.claims(&members()), &raw),
            StatusCode::UNAUTHORIZED,
            "signed for another tool or another request",
        );
    }

    #[test]
    fn the_tool_and_its_pack_are_this_runners() {
        let f = runner(|_| {});
        let unknown = request("consul.nope", json!({}), Mode::Execute);
        refused(
            f.admit(&unknown),
            StatusCode::NOT_FOUND,
            "unknown tool `consul.nope`",
        );
        let stale = CallClaims {
            pack_sha256: "0".repeat(64),
            ..f.claims(&members())
        };
        refused(
            f.admit_with(&stale, &members()),
            StatusCode::CONFLICT,
            "pack `consul` differs between server",
        );
    }

    #[test]
    fn the_arguments_fit_the_schema_and_the_allowlists() {
        let f = runner(|c| {
            c.allowlists
                .insert("systemd_units".into(), vec!["consul".into()]);
        });
        let restart = |unit: &str| {
            let r = request(
                "linux.systemctl_restart",
                json!({"unit": unit}),
                Mode::Preview,
            );
            f.admit(&r)
        };
        assert!(restart("consul").is_ok());
        assert!(restart("consul.service").is_ok());
        refused(
            restart("vault"),
            StatusCode::FORBIDDEN,
            "`unit` = `vault` is not in this runner's allowlist `systemd_units`",
        );
        let invalid = request("linux.systemctl_restart", json!({"unit": 7}), Mode::Preview);
        refused(
            f.admit(&invalid),
            StatusCode::BAD_REQUEST,
            "invalid arguments for `linux.systemctl_restart`",
        );
        // A runner without the list admits no value.
        let bare = runner(|_| {});
        let r = request(
            "linux.systemctl_restart",
            json!({"unit": "consul"}),
            Mode::Preview,
        );
        refused(
            bare.admit(&r),
            StatusCode::FORBIDDEN,
            "is not in this runner's allowlist",
        );
    }

    #[test]
    fn preview_values_are_the_ones_this_runner_sealed() {
        let f = runner(|_| {});
        let tool = f.state.packs.tool("nomad.task_resources_set").unwrap();
        let var = tool.preview.as_ref().unwrap().vars[0].clone();
        let args = json!({"job": "traefik", "group": "g", "task": "t", "cpu": 100});
        let with = |vars: Value, seal: Option<&str>, mode: Mode| CallRequest {
            preview: Some(vars.as_object().unwrap().clone()),
            preview_seal: seal.map(str::to_owned),
            ..request("nomad.task_resources_set", args.clone(), mode)
        };
        let vars = json!({ var.clone(): 7 });
        let execute = with(vars.clone(), None, Mode::Execute);
        let claims = CallClaims {
            approval_id: Some("a1".into()),
            ..f.claims(&execute)
        };
        let good = f.seal(&claims, &execute, vars.as_object().unwrap());
        let sealed = with(vars.clone(), Some(&good), Mode::Execute);
        let fresh = |r: &CallRequest| CallClaims {
            jti: uuid::Uuid::new_v4().to_string(),
            request_sha256: r.digest(),
            ..claims.clone()
        };
        assert!(f.admit_with(&fresh(&sealed), &sealed).is_ok());

        let cases = [
            (
                with(vars.clone(), Some(&good), Mode::Preview),
                "a preview or verify call carries no preview values",
            ),
            (
                with(vars.clone(), None, Mode::Execute),
                "carry no seal from this runner",
            ),
            (
                with(vars.clone(), Some("bogus"), Mode::Execute),
                "differ from the ones this runner sealed",
            ),
            (
                with(json!({ var.clone(): 8 }), Some(&good), Mode::Execute),
                "differ from the ones this runner sealed",
            ),
            (
                with(json!({"job": "x"}), Some(&good), Mode::Execute),
                "the preview value `job` is named like a param",
            ),
            (
                with(json!({"other": 1}), Some(&good), Mode::Execute),
                "the preview value `other` is not one the preview",
            ),
        ];
        for (r, want) in cases {
            refused(f.admit_with(&fresh(&r), &r), StatusCode::FORBIDDEN, want);
        }
        // Every stock write has a preview; a read has none.
        let no_preview = CallRequest {
            preview: Some(vars.as_object().unwrap().clone()),
            ..request(
                "linux.unit_status",
                json!({"unit": "consul"}),
                Mode::Execute,
            )
        };
        let status = f.state.packs.tool("linux.unit_status").unwrap();
        refused(
            check_preview_values(&f.state.seal_key, "edge1", status, &claims, &no_preview)
                .map_err(|why| (StatusCode::FORBIDDEN, why)),
            StatusCode::FORBIDDEN,
            "has no preview, so its execution takes no preview values",
        );
    }

    #[test]
    fn a_high_risk_execution_carries_an_approval_used_once_or_the_policys_lowering() {
        let f = runner(|c| {
            c.allowlists
                .insert("systemd_units".into(), vec!["consul".into()]);
        });
        let restart = |mode| request("linux.systemctl_restart", json!({"unit": "consul"}), mode);
        let execute = restart(Mode::Execute);
        refused(
            f.admit(&execute),
            StatusCode::FORBIDDEN,
            "is risk:high: this runner executes it only under a human's approval or the server policy's lowering",
        );
        assert!(
            f.admit(&restart(Mode::Preview)).is_ok(),
            "a preview needs no approval"
        );
        assert!(f.admit(&members()).is_ok(), "a read needs no approval");
        let approved = CallClaims {
            approval_id: Some("a1".into()),
            ..f.claims(&execute)
        };
        assert!(f.admit_with(&approved, &execute).is_ok());
        let again = CallClaims {
            jti: uuid::Uuid::new_v4().to_string(),
            ..approved
        };
        refused(
            f.admit_with(&again, &execute),
            StatusCode::CONFLICT,
            "approval a1 was already executed on this runner",
        );
        let lowered = CallClaims {
            lowered_by_policy: Some("f".repeat(64)),
            ..f.claims(&execute)
        };
        assert!(f.admit_with(&lowered, &execute).is_ok());
    }

    #[test]
    fn a_runner_requiring_witnessed_approvals_needs_the_approval_id_and_its_proof() {
        let f = runner(|_| {});
        let tool = f.state.packs.tool("linux.systemctl_restart").unwrap();
        let mut execute = request(
            "linux.systemctl_restart",
            json!({"unit": "consul"}),
            Mode::Execute,
        );
        let bare = f.claims(&execute);
        refused(
            witnessed_approval(tool, &bare, &execute, 2).map(|_| ()),
            StatusCode::FORBIDDEN,
            "`linux.systemctl_restart` is risk:high and this runner requires witnessed approvals: the call carries no approval",
        );
        let approved = CallClaims {
            approval_id: Some("a1".into()),
            ..bare
        };
        refused(
            witnessed_approval(tool, &approved, &execute, 2).map(|_| ()),
            StatusCode::FORBIDDEN,
            "approval a1: this runner requires a witnessed approval (its approval.approved event in a checkpoint cosigned by 2 witnesses), and the call carries none",
        );
        // What the proof proves is `witnessed::verify`'s to check; here only that it is there.
        execute.witnessed = Some(
            serde_json::from_value(json!({
                "event": {"seq": 7, "id": "e7", "at": "2026-12-06T10:00:00.000000Z",
                    "actor": "person:ana", "kind": "approval.approved",
                    "prev_hash": "", "hash": "", "hash_v": 2},
                "checkpoint": "", "proof": [],
            }))
            .unwrap(),
        );
        let (id, proof) = witnessed_approval(tool, &approved, &execute, 2).unwrap();
        assert_eq!((id, proof.event.seq), ("a1", 7));
    }

    #[test]
    fn an_executed_approval_is_remembered_a_day_at_least() {
        let now = 1_796_551_200;
        let day = now + APPROVAL_MEMORY_SECS;
        assert_eq!(remembered_until(None, now), day);
        assert_eq!(remembered_until(Some(now + 900), now), day);
        assert_eq!(remembered_until(Some(day + 1), now), day + 1);
    }
}
