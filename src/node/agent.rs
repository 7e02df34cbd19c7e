//! `emisar runner`: the per-node HTTP server that executes signed calls.
//!
//! Order of checks for `POST /v1/call`, each refusing with a clear error before anything runs:
//! signature, audience, expiry and lifetime → single-use id → the token matches this request
//! (tool, argument digest) → the tool is in this runner's own packs with the same pack digest
//! → the arguments validate against this runner's own schema → every allowlisted value is in
//! this runner's allowlist → an execution's preview values are ones the tool's preview
//! captures, none named like a param, under this runner's own seal for this call and these
//! arguments → an execution of a risk:high tool carries an approval id never used before, or
//! the policy's lowering. Only then does the action run. A preview's answer carries the seal
//! over what it captured.
//!
//! `GET /healthz` answers liveness (`{"status": "ok"}`) to anyone, and this runner's details
//! (name, pack digests, allowlists) only with a health token the server signed for this
//! runner (its purpose `health`, see [`crate::protocol::signing`]): they tell a stranger which
//! packs to pretend to serve and which values would run here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::approvals::{Gate, GateConfig};
use super::engine::{self, Env};
use super::seal::{SealKey, Sealed};
use crate::node::config::RunnerConfig;
use crate::pack::{PackSet, Risk, Tool, allowlist_admits, shown_value};
use crate::protocol::approval::RunnerApprovals;
use crate::protocol::signing::{CallClaims, CallVerifier, now};
use crate::protocol::witnessed::WitnessTrust;
use crate::protocol::{CallRequest, CallResponse, Mode};

/// The most single-use ids remembered at once. Ids are forgotten when their token expires,
/// so this bounds memory under a flood of valid calls; past it, calls are refused.
const MAX_SEEN_IDS: usize = 100_000;
/// How long a used approval id is remembered. Approvals expire long before this (their
/// default lifetime is 15 minutes), so a remembered id can never be approved again.
const APPROVAL_MEMORY_SECS: u64 = 24 * 3600;

pub struct RunnerState {
    config: RunnerConfig,
    packs: PackSet,
    verifier: CallVerifier,
    /// Single-use ids seen, with the expiry of their token.
    seen: Mutex<HashMap<String, u64>>,
    /// Approval ids already executed here, with when they stop mattering.
    used_approvals: Mutex<HashMap<String, u64>>,
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
        let gate = Gate::load(GateConfig {
            require_signed_approvals: &config.require_signed_approvals,
            approvers_file: config.approvers_file.as_deref(),
            approvers_root_keys: &config.approvers_root_keys,
            state_dir: &config.state_dir,
        })?;
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
            used_approvals: Mutex::new(HashMap::new()),
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

    /// Records `jti` as used; false if it was seen before (or the table is full).
    fn first_use(&self, jti: &str, exp: u64) -> Result<(), &'static str> {
        Self::remember(&self.seen, jti, exp, "this call token was already used")
    }

    /// Records an approval id as executed; refuses one executed before.
    fn first_execution(&self, approval_id: &str) -> Result<(), &'static str> {
        Self::remember(
            &self.used_approvals,
            approval_id,
            now() + APPROVAL_MEMORY_SECS,
            "this approval was already executed on this runner: an approval is good for one execution",
        )
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
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(token) = token else {
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
            ..state.gate.report()
        },
    }))
    .into_response()
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    tracing::warn!(%status, %message, "call refused");
    (status, Json(json!({"error": message}))).into_response()
}

async fn call(
    State(state): State<Arc<RunnerState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return refuse(StatusCode::UNAUTHORIZED, "a signed call token is required");
    };
    let claims = match state.verifier.verify(token) {
        Ok(c) => c,
        Err(e) => return refuse(StatusCode::UNAUTHORIZED, e.to_string()),
    };
    if let Err(why) = state.first_use(&claims.jti, claims.exp) {
        return refuse(StatusCode::CONFLICT, why);
    }
    let request: CallRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("invalid call body: {e}")),
    };
    if claims.tool != request.tool || claims.request_sha256 != request.digest() {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "the call token was signed for another tool or another request",
        );
    }
    let Some(tool) = state.packs.tool(&request.tool) else {
        return refuse(
            StatusCode::NOT_FOUND,
            format!("unknown tool `{}` on this runner", request.tool),
        );
    };
    let pack = state
        .packs
        .pack(&tool.pack)
        .expect("every tool has its pack");
    if pack.digest != claims.pack_sha256 {
        return refuse(
            StatusCode::CONFLICT,
            format!(
                "pack `{}` differs between server ({}) and runner ({}): deploy the same packs to both",
                pack.name, claims.pack_sha256, pack.digest
            ),
        );
    }
    let args = Value::Object(request.args.clone());
    if let Err(errors) = tool.validate(&args) {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!(
                "invalid arguments for `{}`: {}",
                tool.name,
                errors.join("; ")
            ),
        );
    }
    for param in tool.params.iter() {
        // Every value is checked, whatever its type: a list on a number holds for numbers.
        let (Some(list_name), Some(value)) = (&param.allowlist, request.args.get(&param.name))
        else {
            continue;
        };
        let allowed = state
            .config
            .allowlists
            .get(list_name)
            .is_some_and(|list| allowlist_admits(&param.kind, value, list));
        if !allowed {
            let shown = shown_value(param, value);
            return refuse(
                StatusCode::FORBIDDEN,
                format!(
                    "`{}` = {shown} is not in this runner's allowlist `{list_name}` ([allowlists] in runner.toml); nothing was run",
                    param.name
                ),
            );
        }
    }
    if let Err(why) = check_preview_values(&state, tool, &claims, &request) {
        return refuse(StatusCode::FORBIDDEN, why);
    }
    if let Err((status, why)) = check_high_risk(&state, tool, &claims, &request) {
        return refuse(status, why);
    }

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
            let seal = (request.mode == Mode::Preview).then(|| {
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
/// policy's lowering; and where this runner requires people's signatures for the tool, the
/// gate's check of them (which also decides whether a lowering may run here).
fn check_high_risk(
    state: &RunnerState,
    tool: &Tool,
    claims: &CallClaims,
    request: &CallRequest,
) -> Result<(), (StatusCode, String)> {
    let forbidden = |why: String| (StatusCode::FORBIDDEN, why);
    let reused = |approval_id: &str, why: &str| {
        (
            StatusCode::CONFLICT,
            format!("approval {approval_id}: {why}"),
        )
    };
    if tool.risk != Risk::High || request.mode != Mode::Execute {
        return Ok(());
    }
    if let Some(trust) = &state.witnessed {
        // Before anything is recorded as executed: a refused proof leaves the approval
        // runnable once a witnessed one arrives.
        let Some(approval_id) = claims.approval_id.as_deref() else {
            return Err(forbidden(format!(
                "`{}` is risk:high and this runner requires witnessed approvals: the call carries no approval",
                tool.name
            )));
        };
        let Some(witnessed) = &request.witnessed else {
            return Err(forbidden(format!(
                "approval {approval_id}: this runner requires a witnessed approval (its approval.approved event in a checkpoint cosigned by {} witnesses), and the call carries none",
                trust.quorum
            )));
        };
        let cosigned =
            crate::protocol::witnessed::verify(witnessed, approval_id, trust).map_err(|why| {
                forbidden(format!(
                    "approval {approval_id}: the witnessed proof is refused: {why}"
                ))
            })?;
        tracing::info!(tool = %tool.name, %approval_id, event_seq = witnessed.event.seq, cosigned_by = ?cosigned,
            "the approval is in the audit log as witnessed");
    }
    if state.gate.requires(&tool.name) {
        // The gate records the approval id as executed, durably, once everything holds.
        let signed = state
            .gate
            .check(&state.config.name, claims, request)
            .map_err(|why| match why {
                super::approvals::Refusal::Reused(why) => (StatusCode::CONFLICT, why),
                super::approvals::Refusal::Forbidden(why) => forbidden(why),
            })?;
        match signed {
            Some(signed) => {
                let people: Vec<&str> = signed.iter().map(|s| s.person.as_str()).collect();
                tracing::info!(tool = %tool.name, call_id = %claims.call_id, approval_id = ?claims.approval_id, signed_by = ?people,
                    "executing a risk:high tool under people's signatures checked here");
            }
            None => {
                tracing::warn!(tool = %tool.name, call_id = %claims.call_id, policy_sha256 = ?claims.lowered_by_policy,
                    "executing a risk:high tool without approval: the server's policy lowered it and this runner's approvers file allows it unapproved");
            }
        }
        return Ok(());
    }
    match (
        claims.approval_id.as_deref(),
        claims.lowered_by_policy.as_deref(),
    ) {
        (Some(approval_id), _) => state
            .first_execution(approval_id)
            .map_err(|why| reused(approval_id, why)),
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

/// The preview values an execution brings must be ones the tool's preview captures, never
/// named like a param (a value would stand in for the approved argument in a template), and
/// exactly the ones this runner sealed for this call and these arguments.
fn check_preview_values(
    state: &RunnerState,
    tool: &Tool,
    claims: &CallClaims,
    request: &CallRequest,
) -> Result<(), String> {
    let given = match (request.mode, &request.preview) {
        (_, None) => return Ok(()),
        (Mode::Preview, Some(_)) => {
            return Err("a preview call carries no preview values; nothing was run".into());
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
        runner: &state.config.name,
        call_id: &claims.call_id,
        tool: &tool.name,
        pack_sha256: &claims.pack_sha256,
        args: &request.args,
        vars: given,
    };
    match &request.preview_seal {
        Some(seal) if state.seal_key.verify(&sealed, seal) => Ok(()),
        Some(_) => Err(
            "the preview values differ from the ones this runner sealed at request time for this call and these arguments (changed on the way, or sealed before this runner restarted); nothing was run: request the change again".into(),
        ),
        None => Err(
            "the preview values carry no seal from this runner; nothing was run: request the change again".into(),
        ),
    }
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
