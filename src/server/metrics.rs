//! Prometheus metrics: one process-wide recorder, rendered at `/metrics`.
//!
//! Names: `emisar_tool_calls_total{tool,outcome}`, `emisar_runner_calls_total{tool,runner,outcome}`,
//! `emisar_runner_call_seconds{tool,runner}`, `emisar_audit_batch_size`,
//! `emisar_audit_append_seconds`, `emisar_audit_lag_seconds`, `emisar_audit_batches_failed_total`,
//! `emisar_runner_breaker_state{runner}` (0 closed, 1 half-open, 2 open),
//! `emisar_runner_up{runner}`, `emisar_rate_limited_total{agent}`,
//! `emisar_rate_limit_fallbacks_total` (calls admitted without the shared rate limit, whose
//! store did not answer),
//! `emisar_webhook_deliveries_total{host,outcome}`, `emisar_webhook_dropped_total{host,reason}`
//! (every notice target, webhook or email, by its host),
//! `emisar_audit_refusals_counted_total{kind,how}` (refusals counted into a `refusal.repeated`
//! aggregate instead of written one by one; `how` is `counted`, or `folded` into the overflow
//! key past the tracked-key cap), `emisar_join_rate_limited_total`,
//! `emisar_approvals_expired_total` (requests that expired with nobody's answer, counted by the
//! replica that expired them). Two series are this server's own, checked on every scrape and
//! rendered after the recorder's by [`with_scraped`] (so two servers in one process never
//! report each other's): `emisar_ready` (1 when `/readyz` would answer 200, else 0) and
//! `emisar_approvals_pending` (the approval backlog: requests waiting for people, counted in
//! the shared store, so every replica reports the whole backlog).
//!
//! Invariant: a label's value never comes straight from outside, so no caller can grow the
//! number of series. A `tool` label is a tool some gateway of this process offers
//! ([`known_tools`]) or `unknown`; `agent` and `runner` labels are identifiers (names of
//! authenticated callers and of registered runners) or `unknown`; outcomes are fixed words.

use std::collections::BTreeSet;
use std::sync::{OnceLock, RwLock};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the recorder once per process and returns the handle that renders it. (Tests run
/// several servers in one process; they share it.)
pub(crate) fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0,
                ])
                .expect("static buckets are valid")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (an embedding program's): then ours
            // still renders what it was given, and the global macros go to theirs.
            let _ = metrics::set_global_recorder(recorder);
            start_counters_at_zero();
            handle
        })
        .clone()
}

/// Registers, at 0, the unlabelled counters that alerts take the `increase()` of. A counter
/// that first appears at 1 has no earlier sample, so Prometheus would see no increase, and the
/// first failed audit batch would page nobody.
fn start_counters_at_zero() {
    for name in [
        "emisar_audit_batches_failed_total",
        "emisar_approvals_expired_total",
        "emisar_rate_limit_fallbacks_total",
    ] {
        metrics::counter!(name).increment(0);
    }
}

/// The tools the gateways of this process offer: the only values a `tool` label takes.
static KNOWN_TOOLS: RwLock<BTreeSet<String>> = RwLock::new(BTreeSet::new());

/// Adds `names` to the tools a `tool` label may name (a gateway calls it with its tools).
pub(crate) fn known_tools<'a>(names: impl IntoIterator<Item = &'a str>) {
    let mut known = KNOWN_TOOLS.write().unwrap_or_else(|p| p.into_inner());
    known.extend(names.into_iter().map(str::to_owned));
}

/// `tool` if it is a known tool, else `unknown`.
fn tool_label(tool: &str) -> String {
    let known = KNOWN_TOOLS.read().unwrap_or_else(|p| p.into_inner());
    if known.contains(tool) {
        tool.to_owned()
    } else {
        "unknown".to_owned()
    }
}

/// `name` if it is an identifier (an authenticated agent's or a registered runner's name),
/// else `unknown`.
fn name_label(name: &str) -> String {
    if crate::util::input::is_identifier(name) {
        name.to_owned()
    } else {
        "unknown".to_owned()
    }
}

pub(crate) fn tool_call(tool: &str, outcome: &'static str) {
    metrics::counter!("emisar_tool_calls_total", "tool" => tool_label(tool), "outcome" => outcome)
        .increment(1);
}

pub(crate) fn runner_call(tool: &str, runner: &str, outcome: &'static str, seconds: f64) {
    metrics::counter!("emisar_runner_calls_total", "tool" => tool_label(tool), "runner" => name_label(runner), "outcome" => outcome)
        .increment(1);
    metrics::histogram!("emisar_runner_call_seconds", "tool" => tool_label(tool), "runner" => name_label(runner)).record(seconds);
}

pub(crate) fn audit_batch(size: usize, seconds: f64, ok: bool) {
    metrics::histogram!("emisar_audit_batch_size").record(size as f64);
    metrics::histogram!("emisar_audit_append_seconds").record(seconds);
    if !ok {
        metrics::counter!("emisar_audit_batches_failed_total").increment(1);
    }
}

/// The size of the latest checkpoint the log key signed.
pub(crate) fn checkpoint_made(size: u64) {
    metrics::gauge!("emisar_checkpoint_size").set(size as f64);
}

/// The size of the latest checkpoint the witness quorum cosigned.
pub(crate) fn checkpoint_witnessed(size: u64) {
    metrics::gauge!("emisar_checkpoint_witnessed_size").set(size as f64);
}

/// A witness refused a checkpoint. `status` is its HTTP answer, `unreachable` when there was
/// none, or `truncated` when the witness has cosigned more events than the log holds (issue
/// 45: events it saw were deleted). `witness` is the name of its key
/// (`witness.example.org/w1`), as listed in the operator's `[transparency]`: a bounded set, so
/// the label is the name itself (an identifier check would turn every such name, with its
/// dots and slash, into `unknown`).
pub(crate) fn witness_refused(witness: &str, status: &str) {
    metrics::counter!("emisar_witness_refusals_total", "witness" => witness.to_owned(), "status" => status.to_owned())
        .increment(1);
}

/// Seconds from a batch's oldest event being handed to the writer until it was durable.
pub(crate) fn audit_lag(seconds: f64) {
    metrics::histogram!("emisar_audit_lag_seconds").record(seconds);
}

pub(crate) fn breaker_state(runner: &str, level: u8) {
    metrics::gauge!("emisar_runner_breaker_state", "runner" => name_label(runner))
        .set(level as f64);
}

pub(crate) fn runner_up(runner: &str, up: bool) {
    metrics::gauge!("emisar_runner_up", "runner" => name_label(runner)).set(if up {
        1.0
    } else {
        0.0
    });
}

pub(crate) fn rate_limited(agent: &str) {
    metrics::counter!("emisar_rate_limited_total", "agent" => name_label(agent)).increment(1);
}

/// A call admitted on this replica's own rate limit alone, because the shared one
/// (`shared_limit.rs`) did not answer; or a flush of admitted calls the store refused.
pub(crate) fn rate_limit_fallback() {
    metrics::counter!("emisar_rate_limit_fallbacks_total").increment(1);
}

/// A refusal was counted into an aggregate rather than written on its own. `kind` is an audit
/// event kind (a constant), `how` is `counted` or `folded`.
pub(crate) fn refusal_counted(kind: &'static str, how: &'static str) {
    metrics::counter!("emisar_audit_refusals_counted_total", "kind" => kind, "how" => how)
        .increment(1);
}

/// A pending request expired before enough people answered it.
pub(crate) fn approval_expired_unanswered() {
    metrics::counter!("emisar_approvals_expired_total").increment(1);
}

/// What a scrape checks on this server itself, at the time of the scrape.
pub(crate) struct Scraped {
    /// `/readyz` would answer 200.
    pub ready: bool,
    /// Requests waiting for people, or `None` when the store did not say in time (the series
    /// is then left out rather than reported stale).
    pub approvals_pending: Option<u64>,
}

/// `rendered` (the recorder's text) followed by the series of `scraped`.
pub(crate) fn with_scraped(mut rendered: String, scraped: &Scraped) -> String {
    if !rendered.is_empty() && !rendered.ends_with('\n') {
        rendered.push('\n');
    }
    let ready = u8::from(scraped.ready);
    rendered.push_str(&format!(
        "# HELP emisar_ready 1 when /readyz answers 200 (store and audit writer healthy), else 0\n\
         # TYPE emisar_ready gauge\n\
         emisar_ready {ready}\n"
    ));
    if let Some(n) = scraped.approvals_pending {
        rendered.push_str(&format!(
            "# HELP emisar_approvals_pending Approval requests waiting for people (pending, not expired)\n\
             # TYPE emisar_approvals_pending gauge\n\
             emisar_approvals_pending {n}\n"
        ));
    }
    rendered
}

/// A join was refused by the per-address join limit, before the store was asked.
pub(crate) fn join_rate_limited() {
    metrics::counter!("emisar_join_rate_limited_total").increment(1);
}

/// A notice delivery (webhook or email) finished: `delivered`, `refused` (a 4xx answer, a
/// permanent SMTP refusal) or `failed` (after retries).
pub(crate) fn webhook_delivery(host: &str, outcome: &'static str) {
    metrics::counter!("emisar_webhook_deliveries_total", "host" => host.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// A notice never reached a target's queue: `queue_full` or `stopped`.
pub(crate) fn webhook_dropped(host: &str, reason: &'static str) {
    metrics::counter!("emisar_webhook_dropped_total", "host" => host.to_owned(), "reason" => reason)
        .increment(1);
}

/// A sign-in through the OpenID provider ended: `ok`, or why it was refused (a stable code
/// such as `nonce_mismatch`, never text from the request).
pub(crate) fn oidc_sign_in(outcome: &'static str) {
    metrics::counter!("emisar_oidc_sign_ins_total", "outcome" => outcome).increment(1);
}

/// A bearer token on `/mcp` that is not emisar's own was refused as an OAuth access token,
/// by the check it failed (`expired`, `wrong_audience`, `unknown_key`, ...).
pub(crate) fn oauth_refused(code: &'static str) {
    metrics::counter!("emisar_oauth_refused_total", "check" => code).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_only_take_known_names() {
        known_tools(["traefik.ping"]);
        assert_eq!(tool_label("traefik.ping"), "traefik.ping");
        assert_eq!(tool_label("traefik.pong"), "unknown");
        assert_eq!(tool_label(&"x\0".repeat(1000)), "unknown");
        assert_eq!(name_label("deploy-bot"), "deploy-bot");
        assert_eq!(name_label("bot\r\nevil 1"), "unknown");
    }

    #[test]
    fn scraped_series_follow_the_recorders_text() {
        let ready = with_scraped(
            "a_total 3".into(),
            &Scraped {
                ready: true,
                approvals_pending: Some(4),
            },
        );
        assert!(
            ready.starts_with("a_total 3\n# HELP emisar_ready "),
            "{ready}"
        );
        assert!(
            ready.contains("\n# TYPE emisar_ready gauge\nemisar_ready 1\n"),
            "{ready}"
        );
        assert!(
            ready
                .ends_with("\n# TYPE emisar_approvals_pending gauge\nemisar_approvals_pending 4\n"),
            "{ready}"
        );
        let degraded = with_scraped(
            String::new(),
            &Scraped {
                ready: false,
                approvals_pending: None,
            },
        );
        assert!(degraded.starts_with("# HELP emisar_ready "), "{degraded}");
        assert!(degraded.ends_with("\nemisar_ready 0\n"), "{degraded}");
        assert!(!degraded.contains("emisar_approvals_pending"), "{degraded}");
    }
}
