//! Approval latency benchmark: approval click → runner execution starts, through the real
//! server, runner and HTTP APIs. The budget (≤ 20 ms at p95 with 10 approvals at once) is
//! scripts/bench's to judge: it writes the row to docs/BENCHMARKS.md ("Against the budget").
//!
//!   DATABASE_URL=postgres://… cargo bench --bench approval
//!
//! One process runs an `emisar serve` [`Application`](emisar::server::app::Application) and an
//! `emisar runner` (stock packs; its exec PATH starts with a temporary directory holding a
//! `systemctl` stand-in, a static C program that on `restart` appends the time it started (ns
//! since the epoch) to a file). An agent's MCP
//! client (rmcp, streamable HTTP) calls `linux.systemctl_restart {unit: consul}` in the
//! background; once the request is listed as pending (and a short settle), the bench takes
//! t0 (wall clock, ns since the epoch) just before it POSTs `/api/approvals/{id}/approve`
//! with an approver's bearer token. The latency is the stand-in's timestamp − t0: the moment
//! the approved argv is running on the runner. Requests first run one after another (latency
//! without queueing), then in batches: `BENCH_APPROVAL_AT_ONCE` calls wait for approval at
//! the same time and are all clicked at once (one POST each, sent concurrently right after
//! t0), and each approval's latency is its argv's timestamp − that t0 (the goal's "10
//! approvals at once").
//!
//! Environment:
//! - `DATABASE_URL`: a PostgreSQL database (migrated on connect; best empty). Without it
//!   the PostgreSQL part is skipped.
//! - `BENCH_APPROVALS` (200): timed approvals per backend, after `BENCH_APPROVAL_WARMUP`
//!   (10) untimed ones.
//! - `BENCH_APPROVAL_SQLITE` (1): also run against a temporary SQLite file (WAL, as
//!   `emisar dev` opens it); 0 skips it.
//! - `BENCH_APPROVAL_SETTLE_MS` (20): pause between seeing the request pending and the click,
//!   so that the click does not race the tail of the request's own creation.
//! - `BENCH_APPROVAL_AT_ONCE` (10): approvals clicked at once in the batch part, and
//!   `BENCH_APPROVAL_BATCHES` (20): timed batches, after one warm-up batch; 0 batches skips it.
//! - `BENCH_APPROVAL_SIGNED` (0): approvals signed by people: the runner requires signatures
//!   (`require_signed_approvals = ["*"]`, an approvers file with one Ed25519 key), the server
//!   has the file, and every click carries an SSHSIG over the request's statement (made before
//!   t0, as a person signs before the click reaches the server). Also times the signature
//!   checks alone (`verify_quorum`: one SSH signature, one ES256 passkey assertion).
//! - `BENCH_APPROVAL_WITNESSED` (0): the runner requires witnessed approvals
//!   (`require_witnessed`): the server signs checkpoints at its defaults (every 1,000 ms or
//!   1,000 events) and submits them to one `emisar witness` in this process (quorum 1), and an
//!   execution waits for a checkpoint the witness cosigned over its approval.
//! - `BENCH_SUMMARY`: a file to write `key=value` lines to (for scripts/bench's budget table).
//!
//! Progress goes to stderr; the results go to stdout as Markdown.

// The bench compiles its `systemctl` stand-in with cc and runs it (clippy.toml keeps product
// code from starting processes).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Out, env_num, log, ms};
use emisar::node::agent::{self, RunnerState};
use emisar::node::config::RunnerConfig;
use emisar::server::app::Application;
use emisar::server::audit::{self, AuditFilter, AuditLog};
use emisar::server::config::{RunnerEntry, ServerConfig};
use emisar::server::db::Db;
use emisar::server::principal::Role;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const RUNNER: &str = "bench-runner";
const TOOL: &str = "linux.systemctl_restart";

/// Wall clock, ns since the epoch (what the stand-in writes).
fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_nanos() as i128
}

/// Latency samples in nanoseconds (signed: two clocks' readings are subtracted).
#[derive(Default)]
struct Samples(Vec<i128>);

impl Samples {
    fn pct(&mut self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        self.0.sort_unstable();
        let i = ((p / 100.0) * (self.0.len() - 1) as f64).round() as usize;
        self.0[i] as f64 / 1e6
    }
}

/// The `systemctl` stand-in: `restart` appends the time it starts (ns since the epoch, its
/// first call) to `record`; `show` prints a running unit (the tool's optional `after` step).
///
/// A small static C program, compiled here with `cc` (the C compiler Rust links with), so that
/// its timestamp is the moment the runner's child starts executing. A shell script calling
/// `date +%s%N`, as this was, stamped after two process starts (`/bin/sh`, then `date`),
/// ~1.5 ms of which was the stand-in's own; with ten approvals at once, twenty process starts
/// on two cores queued behind each other.
fn write_standin(dir: &Path, record: &Path) -> PathBuf {
    let record = record.to_str().expect("the record path is UTF-8");
    assert!(
        !record.contains(['"', '\\', '\n']),
        "the record path goes into a C string literal as it is: {record}"
    );
    let source = format!(
        r#"#include <stdio.h>
#include <string.h>
#include <time.h>
int main(int argc, char **argv) {{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    if (argc > 1 && strcmp(argv[1], "restart") == 0) {{
        FILE *f = fopen("{record}", "a");
        if (!f) return 1;
        fprintf(f, "%lld%09ld\n", (long long)t.tv_sec, t.tv_nsec);
        return fclose(f) == 0 ? 0 : 1;
    }}
    if (argc > 1 && strcmp(argv[1], "show") == 0)
        fputs("ActiveState=active\nSubState=running\nMainPID=4242\n", stdout);
    return 0;
}}
"#
    );
    let c = dir.join("systemctl.c");
    std::fs::write(&c, source).expect("write the stand-in's source");
    let path = dir.join("systemctl");
    let out = std::process::Command::new("cc")
        .args(["-O2", "-static", "-o"])
        .arg(&path)
        .arg(&c)
        .output()
        .expect("the stand-in needs a C compiler as `cc` (Rust links with it)");
    assert!(
        out.status.success(),
        "cc could not build the stand-in: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn recorded(record: &Path) -> Vec<i128> {
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            l.trim()
                .parse()
                .expect("the stand-in writes ns since the epoch")
        })
        .collect()
}

/// The floor under any measurement here: spawning the stand-in directly (cleared
/// environment, as the runner does) until it has taken its timestamp.
fn standin_floor(standin: &Path, path_env: &str, record: &Path, n: usize) -> Samples {
    let mut s = Samples::default();
    for _ in 0..n {
        let before = recorded(record).len();
        let t0 = now_ns();
        let status = std::process::Command::new(standin)
            .args(["restart", "--", "consul"])
            .env_clear()
            .env("PATH", path_env)
            .env("LANG", "C.UTF-8")
            .stdin(std::process::Stdio::null())
            .status()
            .expect("run the stand-in");
        assert!(status.success());
        let times = recorded(record);
        assert_eq!(times.len(), before + 1);
        s.0.push(times[before] - t0);
    }
    s
}

/// One measured approval, in ns since the epoch.
struct Round {
    id: String,
    t0: i128,
    posted: i128,
    executed: i128,
    returned: i128,
}

struct Rig {
    /// Signs each approval's statement (BENCH_APPROVAL_SIGNED).
    signer: Option<ssh_key::PrivateKey>,
    base: String,
    http: reqwest::Client,
    approver_token: String,
    agent_actor: String,
    client: rmcp::service::RunningService<rmcp::RoleClient, ()>,
    record: PathBuf,
    db: Db,
    stop: CancellationToken,
}

async fn start(url: &str, dir: &Path, tag: &str) -> (Rig, PathBuf, String) {
    let private_key = dir.join("server.key");
    let public_key = dir.join("server.pub");
    emisar::protocol::signing::write_keypair(&private_key, &public_key).expect("keypair");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    let record = dir.join("restarts");
    let standin = write_standin(&bin, &record);
    let stop = CancellationToken::new();

    let mut runner = RunnerConfig::with_name(RUNNER);
    runner.listen = "127.0.0.1:0".into();
    runner.server_public_key_file = Some(public_key.clone());
    runner.exec_path = format!("{}:/usr/bin:/bin", bin.display());
    runner.allowlists = BTreeMap::from([("systemd_units".to_owned(), vec!["consul".to_owned()])]);
    let signer = signed()
        .then(|| ssh_key::PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&[5; 32])));
    let approvers_file = signer.as_ref().map(|key| {
        let file = dir.join("approvers.toml");
        std::fs::write(
            &file,
            format!(
                "serial = 1\n[[person]]\nname = \"bench-approver\"\nssh = [\"{}\"]\n[[rule]]\ntools = \"*\"\napprovals = 1\n",
                key.public_key().to_openssh().expect("openssh")
            ),
        )
        .expect("approvers file");
        file
    });
    if let Some(file) = &approvers_file {
        runner.require_signed_approvals = vec!["*".into()];
        runner.approvers_file = Some(file.clone());
        runner.state_dir = dir.join("runner-state");
    }
    let transparency = if witnessed() {
        // The log key and one witness (in this process, on loopback) that trusts it.
        let log_key =
            emisar::tlog::keys::NoteKey::generate("bench.emisar.test/audit").expect("log key");
        let log_key_file = dir.join("log.key");
        emisar::util::files::create_private(&log_key_file, log_key.private_text().as_bytes())
            .expect("log key file");
        let witness_key = dir.join("witness.key");
        let witness_vkey = emisar::witness::serve::keygen("bench.witness.test/w1", &witness_key)
            .expect("witness key");
        let witness_toml = dir.join("witness.toml");
        std::fs::write(
            &witness_toml,
            format!(
                "listen = \"127.0.0.1:0\"\nkey_file = \"{}\"\nstate_dir = \"{}\"\ninsecure_http = true\n\
                 [[log]]\norigin = \"bench.emisar.test/audit\"\nkeys = [\"{}\"]\n",
                witness_key.display(),
                dir.join("witness-state").display(),
                log_key.verifier_key()
            ),
        )
        .expect("witness.toml");
        let witness = emisar::witness::serve::WitnessServer::build(
            &emisar::witness::config::WitnessConfig::load(&witness_toml).expect("witness config"),
        )
        .await
        .expect("witness");
        let witness_url = format!("http://{}", witness.local_addr());
        tokio::spawn(witness.run_until_stopped(stop.clone()));
        runner.require_witnessed = true;
        runner.log_key = Some(log_key.verifier_key());
        runner.witness_keys = vec![witness_vkey.clone()];
        Some(emisar::server::audit::checkpoints::TransparencyConfig {
            log_key_file,
            checkpoint_interval_ms: 1000,
            checkpoint_every_events: 1000,
            witnesses: vec![emisar::server::audit::checkpoints::WitnessEntry {
                url: witness_url,
                key: witness_vkey,
            }],
            witness_quorum: None,
        })
    } else {
        None
    };
    let exec_path = runner.exec_path.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind runner");
    let runner_url = format!("http://{}", listener.local_addr().expect("addr"));
    let state = RunnerState::new(runner).expect("runner state");
    tokio::spawn(agent::run(listener, state, stop.clone()));

    let config = ServerConfig {
        listen: "127.0.0.1:0".into(),
        runners: vec![RunnerEntry {
            name: RUNNER.into(),
            url: runner_url,
            tls_fingerprint: None,
            packs: None,
            labels: Default::default(),
        }],
        // The runner is on loopback in this process.
        insecure_http: true,
        // Sequential calls only; the limiter must not be what is measured.
        rate_limit_per_second: 1000,
        rate_limit_burst: 1000,
        approval_wait_secs: 600,
        approvers_file,
        transparency,
        ..ServerConfig::with_signing_key(private_key)
    };
    let app = Application::build(config, url)
        .await
        .expect("the server builds");
    let addr = app.local_addr();
    let db = app.db().clone();
    let app_stop = app.shutdown_token();
    let outer = stop.clone();
    tokio::spawn(async move {
        outer.cancelled().await;
        app_stop.cancel();
    });
    tokio::spawn(app.run_until_stopped());

    // People and tokens, written as `emisar user add` / `emisar token issue` would.
    let audit = AuditLog::start(db.clone());
    let agent_name = format!("bench-agent-{tag}");
    let approver = format!("bench-approver-{tag}");
    let ttl = Duration::from_secs(24 * 3600);
    let agent_token =
        emisar::server::tokens::issue(&db, &audit, &agent_name, Role::Agent, ttl, "bench")
            .await
            .expect("agent token")
            .token;
    emisar::server::users::add(
        &db,
        &audit,
        &approver,
        Role::Approver,
        "bench-correct-horse-battery-staple",
        "bench",
    )
    .await
    .expect("approver (use a database without this bench's people)");
    let approver_token =
        emisar::server::tokens::issue(&db, &audit, &approver, Role::Approver, ttl, "bench")
            .await
            .expect("approver token")
            .token;
    drop(audit);

    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("http://{addr}/mcp"))
            .auth_header(agent_token),
    );
    let client = ().serve(transport).await.expect("MCP client connects");
    (
        Rig {
            signer,
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            approver_token,
            agent_actor: format!("agent:{agent_name}"),
            client,
            record,
            db,
            stop,
        },
        standin,
        exec_path,
    )
}

impl Rig {
    /// The approve POST's body: with a signature over the request's statement when signed
    /// (read and signed before the click is timed).
    async fn approve_body(&self, id: &str) -> Value {
        let Some(key) = &self.signer else {
            return json!({});
        };
        let request: Value = self
            .http
            .get(format!("{}/api/approvals/{id}", self.base))
            .bearer_auth(&self.approver_token)
            .send()
            .await
            .expect("show")
            .json()
            .await
            .expect("show body");
        let text = request["statement"]["text"]
            .as_str()
            .expect("a signed request has a statement");
        let sig = key
            .sign(
                emisar::protocol::approval::sshsig::APPROVAL_NAMESPACE,
                ssh_key::HashAlg::Sha512,
                text.as_bytes(),
            )
            .expect("sign")
            .to_pem(ssh_key::LineEnding::LF)
            .expect("pem");
        json!({"signature": {"kind": "ssh", "signer": "bench-approver", "signature": sig}})
    }

    /// The id of this bench's pending request, once it is listed.
    async fn wait_pending(&self, seen: &std::collections::HashSet<String>) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let res = self
                .http
                .get(format!("{}/api/approvals?state=pending", self.base))
                .bearer_auth(&self.approver_token)
                .send()
                .await
                .expect("list approvals");
            assert_eq!(res.status(), 200);
            let body: Value = res.json().await.expect("JSON");
            let found = body["approvals"]
                .as_array()
                .expect("a list")
                .iter()
                .filter(|a| a["requester"] == self.agent_actor.as_str())
                .filter_map(|a| a["id"].as_str())
                .find(|id| !seen.contains(*id))
                .map(str::to_owned);
            if let Some(id) = found {
                return id;
            }
            assert!(Instant::now() < deadline, "no pending request within 30 s");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The ids of `n` of this bench's pending requests not seen before, once all are listed.
    async fn wait_pending_n(
        &self,
        n: usize,
        seen: &std::collections::HashSet<String>,
    ) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let res = self
                .http
                .get(format!("{}/api/approvals?state=pending", self.base))
                .bearer_auth(&self.approver_token)
                .send()
                .await
                .expect("list approvals");
            assert_eq!(res.status(), 200);
            let body: Value = res.json().await.expect("JSON");
            let found: Vec<String> = body["approvals"]
                .as_array()
                .expect("a list")
                .iter()
                .filter(|a| a["requester"] == self.agent_actor.as_str())
                .filter_map(|a| a["id"].as_str())
                .filter(|id| !seen.contains(*id))
                .map(str::to_owned)
                .collect();
            if found.len() >= n {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {n} requests pending within 30 s",
                found.len()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// `k` calls waiting for approval at once, all clicked at once: per approval, the time
    /// from the batch's t0 until its argv runs, and until its POST answered, in ns; and the
    /// approval ids with that t0.
    async fn batch(
        &self,
        b: usize,
        k: usize,
        settle: Duration,
        seen: &mut std::collections::HashSet<String>,
    ) -> Batch {
        let before = recorded(&self.record).len();
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..k {
            let peer = self.client.peer().clone();
            let params = CallToolRequestParams::new(TOOL.to_owned()).with_arguments(
                json!({"unit": "consul", "runners": [RUNNER], "reason": format!("approval latency bench, batch {b}, call {i}")})
                    .as_object()
                    .expect("an object")
                    .clone(),
            );
            calls.spawn(async move {
                let res: CallToolResult = peer.call_tool(params).await.expect("the call completes");
                res
            });
        }
        let ids = self.wait_pending_n(k, seen).await;
        seen.extend(ids.iter().cloned());
        tokio::time::sleep(settle).await;

        let mut requests = Vec::new();
        for id in &ids {
            let body = self.approve_body(id).await;
            requests.push(
                self.http
                    .post(format!("{}/api/approvals/{id}/approve", self.base))
                    .bearer_auth(&self.approver_token)
                    .json(&body),
            );
        }
        let mut posts = tokio::task::JoinSet::new();
        let t0 = now_ns();
        for request in requests {
            posts.spawn(async move {
                let res = request.send().await.expect("approve");
                let status = res.status();
                let body = res.bytes().await.expect("approve body");
                (status, body, now_ns())
            });
        }
        let mut answered = Vec::with_capacity(k);
        while let Some(done) = posts.join_next().await {
            let (status, body, at) = done.expect("the approve task");
            assert_eq!(
                status,
                200,
                "approve refused: {}",
                String::from_utf8_lossy(&body)
            );
            answered.push(at - t0);
        }
        let all = async {
            while let Some(done) = calls.join_next().await {
                let result = done.expect("the call task");
                assert_eq!(result.is_error, Some(false), "{result:?}");
                let out = result.structured_content.expect("structured content");
                assert_eq!(out["approval"]["state"], "executed", "{out}");
            }
        };
        tokio::time::timeout(Duration::from_secs(60), all)
            .await
            .expect("the MCP calls return within 60 s");
        let times = recorded(&self.record);
        assert_eq!(times.len(), before + k, "exactly one restart per approval");
        Batch {
            exec: times[before..].iter().map(|t| t - t0).collect(),
            answered,
            ids,
            t0,
        }
    }

    async fn round(
        &self,
        i: usize,
        settle: Duration,
        seen: &mut std::collections::HashSet<String>,
    ) -> Round {
        let before = recorded(&self.record).len();
        let peer = self.client.peer().clone();
        let params = CallToolRequestParams::new(TOOL.to_owned()).with_arguments(
            json!({"unit": "consul", "runners": [RUNNER], "reason": format!("approval latency bench, round {i}")})
                .as_object()
                .expect("an object")
                .clone(),
        );
        let call = tokio::spawn(async move {
            let res: CallToolResult = peer.call_tool(params).await.expect("the call completes");
            (res, now_ns())
        });
        let id = self.wait_pending(seen).await;
        seen.insert(id.clone());
        tokio::time::sleep(settle).await;

        let body = self.approve_body(&id).await;
        let request = self
            .http
            .post(format!("{}/api/approvals/{id}/approve", self.base))
            .bearer_auth(&self.approver_token)
            .json(&body);
        let t0 = now_ns();
        let res = request.send().await.expect("approve");
        let status = res.status();
        let body = res.bytes().await.expect("approve body");
        let posted = now_ns();
        assert_eq!(
            status,
            200,
            "approve refused: {}",
            String::from_utf8_lossy(&body)
        );
        let (result, returned) = tokio::time::timeout(Duration::from_secs(60), call)
            .await
            .expect("the MCP call returns within 60 s")
            .expect("the call task");
        assert_eq!(result.is_error, Some(false), "{result:?}");
        let out = result.structured_content.expect("structured content");
        assert_eq!(out["approval"]["state"], "executed", "{out}");
        let times = recorded(&self.record);
        assert_eq!(times.len(), before + 1, "exactly one restart per approval");
        Round {
            id,
            t0,
            posted,
            executed: times[before],
            returned,
        }
    }
}

/// `at` of an audit event, ns since the epoch.
/// What one batch of approvals clicked at once measured (see [`Rig::batch`]).
struct Batch {
    exec: Vec<i128>,
    answered: Vec<i128>,
    ids: Vec<String>,
    t0: i128,
}

/// The audit `at` of the `kind` events of approval `id`, in ns.
async fn stamp(db: &Db, id: &str, kind: &str) -> i128 {
    let events = audit::query(
        db,
        &AuditFilter {
            approval_id: Some(id.to_owned()),
            kind: Some(kind.to_owned()),
            limit: 1,
            ..Default::default()
        },
    )
    .await
    .expect("audit query");
    let e = events
        .first()
        .unwrap_or_else(|| panic!("no {kind} for approval {id}"));
    at_ns(&e.at)
}

fn at_ns(at: &str) -> i128 {
    let t = chrono::DateTime::parse_from_rfc3339(at).expect("RFC 3339 `at`");
    t.timestamp_nanos_opt().expect("in range") as i128
}

async fn run_backend(label: &str, prefix: &str, url: &str, out: &mut Out) {
    use std::fmt::Write;
    let n = env_num("BENCH_APPROVALS", 200) as usize;
    let warmup = env_num("BENCH_APPROVAL_WARMUP", 10) as usize;
    let settle = Duration::from_millis(env_num("BENCH_APPROVAL_SETTLE_MS", 20));
    let dir = tempfile::tempdir().expect("temp dir");
    let tag = format!("{}-{prefix}", std::process::id());
    log(format!("{label}: starting server and runner"));
    let (rig, standin, exec_path) = start(url, dir.path(), &tag).await;

    let mut seen = std::collections::HashSet::new();
    log(format!("{label}: {warmup} warm-up approvals"));
    for i in 0..warmup {
        rig.round(i, settle, &mut seen).await;
    }
    log(format!("{label}: {n} timed approvals"));
    let started = Instant::now();
    let mut rounds = Vec::with_capacity(n);
    for i in 0..n {
        rounds.push(rig.round(warmup + i, settle, &mut seen).await);
        if (i + 1) % 50 == 0 {
            log(format!("  {} done", i + 1));
        }
    }
    let wall = started.elapsed();

    // Where the time goes, from the audit log's own stamps (`at` is taken when the writer
    // picks up the batch, before its commit).
    let mut approved = Samples::default();
    let mut executing = Samples::default();
    let mut exec_after_executing = Samples::default();
    for r in &rounds {
        let a = stamp(&rig.db, &r.id, "approval.approved").await;
        let x = stamp(&rig.db, &r.id, "approval.executing").await;
        approved.0.push(a - r.t0);
        executing.0.push(x - r.t0);
        exec_after_executing.0.push(r.executed - x);
    }
    let mut click_to_exec = Samples(rounds.iter().map(|r| r.executed - r.t0).collect());
    let mut click_to_answer = Samples(rounds.iter().map(|r| r.posted - r.t0).collect());
    let mut click_to_result = Samples(rounds.iter().map(|r| r.returned - r.t0).collect());
    let negative = click_to_exec.0.iter().filter(|&&d| d < 0).count();
    let mut floor = standin_floor(&standin, &exec_path, &rig.record, n.min(100));

    let p50 = click_to_exec.pct(50.0);
    let p95 = click_to_exec.pct(95.0);
    out.kv(prefix, "approval_rounds", n);
    out.kv(prefix, "approval_click_to_exec_p50_ms", format!("{p50:.2}"));
    out.kv(prefix, "approval_click_to_exec_p95_ms", format!("{p95:.2}"));
    out.kv(
        prefix,
        "approval_click_to_exec_p99_ms",
        format!("{:.2}", click_to_exec.pct(99.0)),
    );
    out.kv(
        prefix,
        "approval_click_to_exec_max_ms",
        format!("{:.2}", click_to_exec.pct(100.0)),
    );
    out.kv(
        prefix,
        "approval_post_p95_ms",
        format!("{:.2}", click_to_answer.pct(95.0)),
    );
    out.kv(
        prefix,
        "approval_mcp_result_p95_ms",
        format!("{:.2}", click_to_result.pct(95.0)),
    );

    let r = &mut out.report;
    let _ = writeln!(r, "\n#### {label}\n");
    let _ = writeln!(
        r,
        "{n} approvals one after another (after {warmup} warm-up ones), {:.1} s in all; each \
         clicked {} ms after the request was listed as pending. Times from t0, taken just \
         before the approve POST is sent:\n",
        wall.as_secs_f64(),
        settle.as_millis()
    );
    let _ = writeln!(r, "| from the click (t0) until | p50 | p95 | p99 | max |");
    let _ = writeln!(r, "|---|---:|---:|---:|---:|");
    let row = |r: &mut String, what: &str, s: &mut Samples| {
        let _ = writeln!(
            r,
            "| {what} | {} ms | {} ms | {} ms | {} ms |",
            ms(s.pct(50.0)),
            ms(s.pct(95.0)),
            ms(s.pct(99.0)),
            ms(s.pct(100.0))
        );
    };
    row(
        r,
        "**the argv runs on the runner** (the stand-in's first call, `clock_gettime`)",
        &mut click_to_exec,
    );
    row(
        r,
        "the approve POST has answered 200 (body read)",
        &mut click_to_answer,
    );
    row(
        r,
        "the agent's MCP call has returned its result",
        &mut click_to_result,
    );
    row(
        r,
        "`approval.approved` is stamped (audit `at`)",
        &mut approved,
    );
    row(
        r,
        "`approval.executing` is stamped (audit `at`)",
        &mut executing,
    );
    let _ = writeln!(r, "\n| other intervals | p50 | p95 | p99 | max |");
    let _ = writeln!(r, "|---|---:|---:|---:|---:|");
    row(
        r,
        "`approval.executing` stamped → the argv runs (the claim's durable append and commit, signing, runner HTTP and checks, fork/exec)",
        &mut exec_after_executing,
    );
    row(
        r,
        "floor: the bench spawns the stand-in itself → it takes its timestamp (spawn and exec)",
        &mut floor,
    );
    if negative > 0 {
        let _ = writeln!(
            r,
            "\n{negative} rounds had the stand-in's time before t0: the wall clock stepped."
        );
    }

    let k = env_num("BENCH_APPROVAL_AT_ONCE", 10) as usize;
    let batches = env_num("BENCH_APPROVAL_BATCHES", 20) as usize;
    if k > 0 && batches > 0 {
        log(format!(
            "{label}: one warm-up batch, then {batches} batches of {k} approvals at once"
        ));
        rig.batch(0, k, settle, &mut seen).await;
        let started = Instant::now();
        let mut exec = Samples::default();
        let mut answered = Samples::default();
        let mut done = Vec::with_capacity(batches);
        for b in 1..=batches {
            let batch = rig.batch(b, k, settle, &mut seen).await;
            exec.0.extend(&batch.exec);
            answered.0.extend(&batch.answered);
            done.push(batch);
        }
        let wall = started.elapsed();
        // Where the time goes, from the audit log's own stamps, as for one at a time.
        let (mut approved, mut executing) = (Samples::default(), Samples::default());
        for batch in &done {
            for id in &batch.ids {
                approved
                    .0
                    .push(stamp(&rig.db, id, "approval.approved").await - batch.t0);
                executing
                    .0
                    .push(stamp(&rig.db, id, "approval.executing").await - batch.t0);
            }
        }
        let p95 = exec.pct(95.0);
        out.kv(prefix, "approval_at_once", k);
        out.kv(
            prefix,
            "approval_batch_exec_p50_ms",
            format!("{:.2}", exec.pct(50.0)),
        );
        out.kv(prefix, "approval_batch_exec_p95_ms", format!("{p95:.2}"));
        let r = &mut out.report;
        let _ = writeln!(
            r,
            "\n{batches} batches of {k} approvals at once (after one warm-up batch), {:.1} s in \
             all: {k} calls wait for approval at the same time, then all {k} are clicked at \
             once (t0, then {k} concurrent approve POSTs). Per approval, from that t0:\n",
            wall.as_secs_f64()
        );
        let _ = writeln!(
            r,
            "| {k} at once: from the click (t0) until | p50 | p95 | p99 | max |"
        );
        let _ = writeln!(r, "|---|---:|---:|---:|---:|");
        row(
            r,
            "**the argv runs on the runner** (the stand-in's first call, `clock_gettime`)",
            &mut exec,
        );
        row(
            r,
            "its approve POST has answered 200 (body read)",
            &mut answered,
        );
        row(
            r,
            "`approval.approved` is stamped (audit `at`)",
            &mut approved,
        );
        row(
            r,
            "`approval.executing` is stamped (audit `at`)",
            &mut executing,
        );
        log(format!(
            "{label}: {k} at once: click → exec p50 {} ms, p95 {} ms",
            ms(exec.pct(50.0)),
            ms(p95)
        ));
    }

    rig.client.cancel().await.expect("MCP client closes");
    rig.stop.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    rig.db.close().await;
    log(format!(
        "{label}: click → exec p50 {} ms, p95 {} ms",
        ms(p50),
        ms(p95)
    ));
}

/// Whether the runner requires witnessed approvals in this run (`BENCH_APPROVAL_WITNESSED=1`).
fn witnessed() -> bool {
    env_num("BENCH_APPROVAL_WITNESSED", 0) != 0
}

/// Whether approvals are signed by people in this run (`BENCH_APPROVAL_SIGNED=1`).
fn signed() -> bool {
    env_num("BENCH_APPROVAL_SIGNED", 0) != 0
}

/// The runner's signature checks alone (`verify_quorum`, what `node/approvals.rs` runs per
/// execution): one SSH signature, and one ES256 passkey assertion, over a real statement.
fn time_signature_checks(out: &mut Out) {
    use aws_lc_rs::encoding::AsDer;
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use emisar::protocol::approval::{Approvers, Signature, sshsig, statement, verify_quorum};
    use sha2::{Digest, Sha256};
    use std::fmt::Write;

    let text = "emisar-approval/v1\napproval bench\n";
    let ssh = ssh_key::PrivateKey::from(ssh_key::private::Ed25519Keypair::from_seed(&[5; 32]));
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).expect("p256");
    let ec =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref()).expect("p256");
    let spki = ec.public_key().as_der().expect("spki");
    let file = format!(
        "[webauthn]\nrp_id = \"bench.example\"\norigins = [\"https://bench.example\"]\n\
         [[person]]\nname = \"a\"\nssh = [\"{}\"]\n\
         [[person]]\nname = \"b\"\npasskeys = [{{ id = \"AQID\", alg = \"ES256\", public_key = \"{}\" }}]\n\
         [[rule]]\ntools = \"*\"\napprovals = 1\n",
        ssh.public_key().to_openssh().expect("openssh"),
        STANDARD.encode(spki.as_ref())
    );
    let approvers = Approvers::parse(&file).expect("approvers");
    let ssh_sig = Signature::Ssh {
        signer: "a".into(),
        signature: ssh
            .sign(
                sshsig::APPROVAL_NAMESPACE,
                ssh_key::HashAlg::Sha512,
                text.as_bytes(),
            )
            .expect("sign")
            .to_pem(ssh_key::LineEnding::LF)
            .expect("pem"),
    };
    let mut auth_data = Sha256::digest(b"bench.example").to_vec();
    auth_data.extend_from_slice(&[0x05, 0, 0, 0, 1]);
    let client_data = format!(
        r#"{{"type":"webauthn.get","challenge":"{}","origin":"https://bench.example"}}"#,
        URL_SAFE_NO_PAD.encode(statement::hash_text(text))
    );
    let mut signed = auth_data.clone();
    signed.extend_from_slice(&Sha256::digest(client_data.as_bytes()));
    let der = ec.sign(&rng, &signed).expect("es256");
    let passkey_sig = Signature::Webauthn {
        signer: "b".into(),
        credential_id: "AQID".into(),
        authenticator_data: URL_SAFE_NO_PAD.encode(&auth_data),
        client_data_json: URL_SAFE_NO_PAD.encode(client_data.as_bytes()),
        signature: URL_SAFE_NO_PAD.encode(der.as_ref()),
    };
    let _ = writeln!(
        out.report,
        "\n### Signature checks on the runner (`verify_quorum`)\n"
    );
    let _ = writeln!(
        out.report,
        "| signature | n | p50 | p99 |\n|---|---|---|---|"
    );
    for (label, key, sig) in [
        ("OpenSSH Ed25519 (SSHSIG)", "ssh", ssh_sig),
        ("passkey ES256 (WebAuthn)", "passkey", passkey_sig),
    ] {
        let sigs = [sig];
        verify_quorum(&approvers, "t.x", text, &sigs, 1).expect("verifies");
        let mut times: Vec<u64> = (0..2000)
            .map(|_| {
                let t = Instant::now();
                verify_quorum(&approvers, "t.x", text, &sigs, 1).expect("verifies");
                t.elapsed().as_nanos() as u64
            })
            .collect();
        times.sort_unstable();
        let (p50, p99) = (times[times.len() / 2], times[times.len() * 99 / 100]);
        let _ = writeln!(
            out.report,
            "| {label} | {} | {:.3} ms | {:.3} ms |",
            times.len(),
            p50 as f64 / 1e6,
            p99 as f64 / 1e6
        );
        let _ = writeln!(out.summary, "verify_{key}_p50_ms={:.3}", p50 as f64 / 1e6);
        log(format!(
            "{label}: p50 {:.3} ms, p99 {:.3} ms",
            p50 as f64 / 1e6,
            p99 as f64 / 1e6
        ));
    }
}

#[tokio::main]
async fn main() {
    use std::fmt::Write;
    let mut out = Out::default();
    // `cargo bench` passes `--bench`; nothing else is accepted.
    if std::env::args().skip(1).any(|a| a != "--bench") {
        eprintln!(
            "usage: DATABASE_URL=postgres://… cargo bench --bench approval (settings by env, see the file header)"
        );
        std::process::exit(2);
    }
    let _ = writeln!(
        out.report,
        "\nIncluded in \"the argv runs\": the approve POST over loopback HTTP (bearer token \
         lookup), the row lock, the audit append of `approval.approved` and `approval.executing` \
         (the deciding approval claims the request: one durable batch) and the row's commit, \
         signing the call token, the HTTP call to the runner, the runner's checks (token, \
         digests, approval id, allowlist) and the spawn of the stand-in up to its first call \
         (see the floor). An audit `at` is stamped when the \
         audit writer starts the batch the event is in, before that batch commits. Server, \
         runner and bench client share one process and its {} tokio workers; the database server shares the cores.",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if signed() {
        time_signature_checks(&mut out);
    }
    match std::env::var("DATABASE_URL") {
        Ok(url) if url.starts_with("postgres") => {
            run_backend("PostgreSQL", "pg", &url, &mut out).await;
        }
        _ => log("DATABASE_URL is not a postgres:// URL: skipping PostgreSQL"),
    }
    if env_num("BENCH_APPROVAL_SQLITE", 1) != 0 {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("emisar.db").display());
        run_backend("SQLite (WAL)", "sqlite", &url, &mut out).await;
    }
    if let Ok(path) = std::env::var("BENCH_SUMMARY") {
        std::fs::write(&path, &out.summary).expect("write BENCH_SUMMARY");
    }
    print!("{}", out.report);
}
