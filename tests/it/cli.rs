//! The `emisar` binary as people run it: packs commands, token issue, and `emisar dev`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::app::Options;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::call;

fn emisar(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A password in DATABASE_URL never reaches a help text; a server address without its scheme
/// is explained, not passed on to the HTTP client.
#[test]
fn the_cli_keeps_secrets_out_of_help_and_explains_a_bare_address() {
    let out = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["audit", "verify", "--help"])
        .env(
            "DATABASE_URL",
            "postgres://emisar:hunter2@db.example/emisar",
        )
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    assert!(help.contains("DATABASE_URL"), "{help}");
    assert!(!help.contains("hunter2"), "{help}");

    for bare in ["127.0.0.1:7900", "localhost:7900", "ftp://127.0.0.1:7900"] {
        let (code, out, err) = emisar(&["approvals", "list", "--server", bare, "--token", "x"]);
        assert_eq!(code, 2, "{out}{err}");
        assert!(err.contains("--server"), "{err}");
        assert!(err.contains("with its scheme, e.g."), "{err}");
        assert!(!err.contains("relative URL"), "{err}");
    }
}

#[test]
fn packs_check_list_and_show() {
    let (code, out, err) = emisar(&["packs", "check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok  traefik"), "{out}");

    let (code, out, _) = emisar(&["packs", "list"]);
    assert_eq!(code, 0);
    for tool in ["traefik.ping", "traefik.overview", "traefik.services"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(tool))
            .unwrap_or_else(|| panic!("{tool} in {out}"));
        assert!(line.contains(" read "), "{line}");
    }

    let (code, out, _) = emisar(&["packs", "show", "traefik.ping"]);
    assert_eq!(code, 0);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        shown["input_schema"]["required"],
        serde_json::json!(["reason"])
    );
    assert_eq!(shown["steps"][0]["do"]["http"]["path"], "/ping");
    let (_, out, _) = emisar(&["packs", "show", "nomad.task_resources_set"]);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        shown["preview"][3]["do"]["http"]["path"],
        "/v1/job/{job}/plan"
    );
    assert_eq!(shown["steps"][1]["name"], "unchanged");
    assert_eq!(shown["verify"]["within_s"], 300, "{shown}");
    assert_eq!(shown["verify"]["steps"][0]["name"], "job", "{shown}");
    let (_, out, _) = emisar(&["packs", "show", "traefik.ping"]);
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(shown["verify"], Value::Null, "a read has no gate");

    let (code, _, err) = emisar(&["packs", "show", "traefik.nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("no tool named `traefik.nope`"), "{err}");
}

#[test]
fn packs_check_fails_a_free_form_string() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loose.yaml"),
        "pack: loose\ndescription: d\nservice: s\ntools:\n  get:\n    description: d\n    risk: read\n    scope: node\n    params:\n      anything: {type: string}\n    action:\n      http: {method: GET, path: '/x/{anything}'}\n",
    )
    .unwrap();
    let (code, out, err) = emisar(&["packs", "check", "--dir", dir.path().to_str().unwrap()]);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("tool `loose.get`") && err.contains("free-form string"),
        "{err}"
    );
}

/// A write must show its approver something: `packs check` refuses one with neither a
/// preview nor `preview: {none: <reason>}`, or with an empty reason, naming the pack, the
/// tool and the rule; a reason (or a preview) passes.
#[test]
fn packs_check_refuses_a_write_without_a_preview() {
    let check = |preview: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("w.yaml"),
            format!(
                "pack: w\ndescription: d\ntools:\n  wipe:\n    description: d\n    risk: high\n    scope: node\n{preview}    verify: {{none: true changes nothing there is to check}}\n    action:\n      exec: {{argv: [\"true\"]}}\n"
            ),
        )
        .unwrap();
        let file = dir.path().join("w.yaml").display().to_string();
        let (code, out, err) = emisar(&["packs", "check", "--dir", dir.path().to_str().unwrap()]);
        (code, out, err.replace(&file, "w.yaml"))
    };
    let (code, out, err) = check("");
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains(
            "pack w.yaml: tool `w.wipe`: a write needs a `preview`, or `preview: {none: <reason>}`"
        ),
        "{err}"
    );
    let (code, out, err) = check("    preview: {none: '  '}\n");
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("tool `w.wipe`: `preview: {none: <reason>}` needs a reason"),
        "{err}"
    );
    let (code, out, err) = check("    preview: {none: true changes nothing there is to show}\n");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok  w "), "{out}");
    let (code, out, err) =
        check("    preview: {steps: [{name: look, read_only: true, exec: {argv: [uname]}}]}\n");
    assert_eq!(code, 0, "{out}{err}");
}

/// A write must say what healthy means after it, for the gates of its rollouts: `packs
/// check` refuses one with neither a verify nor `verify: {none: <reason>}`, an empty reason,
/// or a verify step that writes, naming the pack, the tool and the rule.
#[test]
fn packs_check_refuses_a_write_without_a_verify() {
    let check = |verify: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("w.yaml"),
            format!(
                "pack: w\ndescription: d\ntools:\n  wipe:\n    description: d\n    risk: high\n    scope: node\n    preview: {{none: true changes nothing there is to show}}\n{verify}    action:\n      exec: {{argv: [\"true\"]}}\n"
            ),
        )
        .unwrap();
        let file = dir.path().join("w.yaml").display().to_string();
        let (code, out, err) = emisar(&["packs", "check", "--dir", dir.path().to_str().unwrap()]);
        (code, out, err.replace(&file, "w.yaml"))
    };
    for (verify, rule) in [
        (
            "",
            "pack w.yaml: tool `w.wipe`: a write needs a `verify`, or `verify: {none: <reason>}`",
        ),
        (
            "    verify: {none: '  '}\n",
            "tool `w.wipe`: `verify: {none: <reason>}` needs a reason",
        ),
        (
            "    verify: {steps: [{name: x, exec: {argv: [rm, /tmp/x]}}]}\n",
            "tool `w.wipe`: verify: step `x`: a verify step only checks health: a command must be marked `read_only: true`",
        ),
    ] {
        let (code, out, err) = check(verify);
        assert_eq!(code, 2, "{verify}: {out}{err}");
        assert!(err.contains(rule), "{verify}: {err}");
    }
    let (code, out, err) = check("    verify: {none: true changes nothing there is to check}\n");
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = check(
        "    verify: {within_s: 5, steps: [{name: look, read_only: true, exec: {argv: [uname]}}]}\n",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok  w "), "{out}");
}

#[test]
fn commands_that_read_the_store_need_a_database() {
    let (code, _, err) = emisar(&["audit", "verify"]);
    assert_eq!(code, 2);
    assert!(err.contains("--database URL or set DATABASE_URL"), "{err}");
    let (code, _, err) = emisar(&["audit", "verify", "--database", "mysql://x"]);
    assert_eq!(code, 2);
    assert!(err.contains("must start with postgres://"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_issued_by_the_cli_works_and_is_audited() {
    let app = spawn_app(
        Backend::Postgres,
        vec![RunnerSpec::new("node-1")],
        Options::default(),
    )
    .await;
    let (code, out, err) = emisar(&[
        "token",
        "issue",
        "--agent",
        "cli-agent",
        "--ttl",
        "1h",
        "--database",
        &app.database_url,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("token:"))
        .unwrap()
        .trim()
        .to_owned();
    let principal = emisar::server::tokens::authenticate(&app.db, &token)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(principal.name, "cli-agent");

    let (code, out, _) = emisar(&[
        "audit",
        "query",
        "--kind",
        "token.issued",
        "--json",
        "--database",
        &app.database_url,
    ]);
    assert_eq!(code, 0);
    assert!(out.contains("\"agent\":\"cli-agent\""), "{out}");
    assert!(!out.contains(&token), "the token itself is never audited");
    let (code, out, _) = emisar(&[
        "audit",
        "query",
        "--kind",
        "token.issued",
        "--database",
        &app.database_url,
    ]);
    assert_eq!(code, 0);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(
        header,
        [
            "seq", "at", "kind", "actor", "tool", "runner", "outcome", "reason"
        ],
        "{out}"
    );
    assert!(lines.any(|l| l.contains("token.issued")), "{out}");

    let (code, _, err) = emisar(&[
        "token",
        "issue",
        "--agent",
        "bad name",
        "--database",
        &app.database_url,
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("agent name `bad name` must be an identifier"),
        "{err}"
    );
}

/// Starts `emisar dev` on a free port in `state` and returns it with its dev.json, once
/// written.
async fn start_dev(state: &std::path::Path, stdout: Stdio) -> (std::process::Child, Value) {
    start_dev_with(state, stdout, &[]).await
}

/// [`start_dev`] with more arguments.
async fn start_dev_with(
    state: &std::path::Path,
    stdout: Stdio,
    more: &[&str],
) -> (std::process::Child, Value) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args([
            "dev",
            "--state-dir",
            state.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(more)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let dev_json = state.join("dev.json");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !dev_json.exists() {
        assert!(
            Instant::now() < deadline,
            "dev.json not written within 30 s"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "emisar dev exited early"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let info = serde_json::from_str(&std::fs::read_to_string(&dev_json).unwrap()).unwrap();
    (child, info)
}

/// A child process stopped however the test ends (a failed assertion too), by its PID.
struct Stop(std::process::Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `emisar dev` starts with no set-up, binds the port it says, and serves MCP with its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emisar_dev_prints_a_working_url_and_token() {
    let state = tempfile::tempdir().unwrap();
    let (child, info) = start_dev(state.path(), Stdio::piped()).await;
    let mut dev = Stop(child);
    let url = info["mcp_url"].as_str().unwrap();
    assert!(
        !url.ends_with(":0/mcp"),
        "dev.json carries the bound port: {url}"
    );
    assert_eq!(info["runners"], serde_json::json!(["local"]));
    // The printed approver logs in to the printed portal.
    let portal = info["portal_url"].as_str().unwrap();
    let login = reqwest::Client::new()
        .post(format!("{portal}api/login"))
        .json(&serde_json::json!({"name": info["approver"], "password": info["approver_password"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 200);
    assert!(
        info["database_url"]
            .as_str()
            .unwrap()
            .starts_with("sqlite://")
    );

    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
        .auth_header(info["agent_token"].as_str().unwrap().to_owned());
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "traefik.ping"));
    // The dev runner asks Traefik at its standard address; whether one runs there or not, the
    // answer names the runner and is either Traefik's or a clear error.
    let res = call(
        &client,
        "traefik.ping",
        serde_json::json!({"runners": ["local"], "reason": "dev smoke test"}),
    )
    .await;
    let r = &res.structured_content.unwrap()["results"][0];
    assert_eq!(r["runner"], "local");
    assert!(
        r["ok"] == true || r["error"].as_str().unwrap().contains("127.0.0.1:8080"),
        "{r}"
    );
    // The quickstart's write (docs/getting-started.md) waits for a person, who denies it
    // with a note the agent reads; a unit the dev runner does not admit is refused at once,
    // once the server has read the runner's allowlists (from its health answer).
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let allowlists = loop {
        let runners: Value = http
            .get(format!("{portal}api/runners"))
            .bearer_auth(info["agent_token"].as_str().unwrap())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let allowlists = &runners["runners"][0]["allowlists"];
        if !allowlists.is_null() {
            break allowlists.clone();
        }
        assert!(
            Instant::now() < deadline,
            "allowlists never read: {runners}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        allowlists["systemd_units"],
        serde_json::json!(["cron"]),
        "{allowlists}"
    );
    let refused = call(
        &client,
        "linux.systemctl_restart",
        serde_json::json!({"runners": ["local"], "unit": "ssh", "reason": "not admitted"}),
    )
    .await;
    let refused = refused.structured_content.unwrap();
    assert_eq!(
        refused["error"]["kind"], "outside_runner_allowlist",
        "{refused}"
    );
    let peer = client.peer().clone();
    let write = tokio::spawn(async move {
        let params = rmcp::model::CallToolRequestParams::new("linux.systemctl_restart")
            .with_arguments(
                serde_json::json!({"runners": ["local"], "unit": "cron", "reason": "quickstart: try a write"})
                    .as_object()
                    .unwrap()
                    .clone(),
            );
        peer.call_tool(params).await.unwrap()
    });
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let session: Value = login.json().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let id = loop {
        let pending: Value = http
            .get(format!("{portal}api/approvals?state=pending"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(id) = pending["approvals"][0]["id"].as_str() {
            break id.to_owned();
        }
        assert!(Instant::now() < deadline, "no pending request: {pending}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let denied = http
        .post(format!("{portal}api/approvals/{id}/deny"))
        .header("cookie", &cookie)
        .header("x-csrf-token", session["csrf"].as_str().unwrap())
        .json(&serde_json::json!({"note": "not on this laptop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 200);
    let res = tokio::time::timeout(Duration::from_secs(20), write)
        .await
        .unwrap()
        .unwrap();
    let out = res.structured_content.unwrap();
    assert_eq!(out["error"]["kind"], "denied_by_human", "{out}");
    client.cancel().await.unwrap();

    // The audit log is a transparency log from the start: the portal's checkpoint panel
    // shows a checkpoint the local witness cosigned, and an auditor holding the printed keys
    // verifies the log against it and against the witness itself.
    let witness_line = format!("\u{2014} {} ", emisar::dev::DEV_WITNESS);
    let deadline = Instant::now() + Duration::from_secs(20);
    let checkpoint = loop {
        let res = http
            .get(format!("{portal}api/audit/checkpoint"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        let status = res.status();
        let text = res.text().await.unwrap();
        if status == 200 && text.contains(&witness_line) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint cosigned by the dev witness within 20 s: {status} {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        checkpoint.starts_with(&format!("{}\n", emisar::dev::DEV_LOG_ORIGIN)),
        "{checkpoint}"
    );
    let kept = state.path().join("kept-checkpoint.txt");
    std::fs::write(&kept, &checkpoint).unwrap();
    let (code, out, err) = emisar(&[
        "audit",
        "verify",
        "--checkpoint",
        kept.to_str().unwrap(),
        "--log-key",
        info["log_key"].as_str().unwrap(),
        "--witness-key",
        info["witness_key"].as_str().unwrap(),
        "--witness-url",
        info["witness_url"].as_str().unwrap(),
        "--database",
        info["database_url"].as_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dev.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = dev.0.wait().unwrap();
    assert!(
        status.success(),
        "emisar dev stops cleanly on SIGTERM: {status}"
    );
    let mut stdout = String::new();
    std::io::Read::read_to_string(dev.0.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    assert!(
        stdout.contains(url) && stdout.contains(info["agent_token"].as_str().unwrap()),
        "{stdout}"
    );
    assert!(
        stdout.contains(info["witness_url"].as_str().unwrap())
            && stdout.contains(info["log_key"].as_str().unwrap()),
        "the witness and the log key are printed: {stdout}"
    );

    // The audit log of the dev database verifies.
    let (code, out, err) = emisar(&[
        "audit",
        "verify",
        "--database",
        info["database_url"].as_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
}

/// The quickstart's grant (README): `emisar dev --signed-approvals` lets a newcomer give the
/// agent a grant and watch its writes run without a new approval. The agent asks for two
/// restarts of cron (`emisar.request_grant`); the dev approver signs it from the terminal with
/// the key and token dev.json names (`emisar grants approve`, the printed command); two
/// restarts then run at once on the local runner (which checks the signature itself), and
/// `emisar.grants` says none is left. The runner's `systemctl` is a stand-in (`--runner-config`), so no
/// service of this machine is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emisar_dev_lets_a_newcomer_try_a_grant() {
    let state = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let record = crate::approvals::systemctl_standin(bin.path());
    let runner_toml = state.path().join("runner.toml");
    std::fs::write(
        &runner_toml,
        format!(
            "name = \"local\"\nlisten = \"127.0.0.1:0\"\nserver_public_key_file = \"{}\"\nexec_path = \"{}:/usr/bin:/bin\"\n\n[allowlists]\nsystemd_units = [\"cron\"]\n",
            state.path().join("server.pub").display(),
            bin.path().display()
        ),
    )
    .unwrap();
    let (child, info) = start_dev_with(
        state.path(),
        Stdio::null(),
        &[
            "--signed-approvals",
            "--runner-config",
            runner_toml.to_str().unwrap(),
        ],
    )
    .await;
    let _dev = Stop(child);
    let (portal, token) = (
        info["portal_url"].as_str().unwrap().trim_end_matches('/'),
        info["approver_token"]
            .as_str()
            .expect("dev.json names the approver's token"),
    );
    let key = info["approver_ssh_key"].as_str().unwrap();

    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let config =
        StreamableHttpClientTransportConfig::with_uri(info["mcp_url"].as_str().unwrap().to_owned())
            .auth_header(info["agent_token"].as_str().unwrap().to_owned());
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.unwrap();
    let asked = call(
        &client,
        "emisar.request_grant",
        serde_json::json!({
            "tools": ["linux.systemctl_restart"], "runners": {"names": ["local"]},
            "args": {"unit": {"in": ["cron"]}}, "calls": 2, "expires_in_secs": 600,
            "reason": "quickstart: try a grant"
        }),
    )
    .await
    .structured_content
    .unwrap();
    let asked = &asked["results"][0]["output"];
    let grant = asked["grant_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{asked}"));
    assert_eq!(asked["status"], "requested", "{asked}");

    let signed = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["grants", "approve", grant, "--ssh-key", key])
        .args(["--server", portal, "--token", token])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        signed.status.success(),
        "{}{}",
        String::from_utf8_lossy(&signed.stdout),
        String::from_utf8_lossy(&signed.stderr)
    );
    let restart = || {
        call(
            &client,
            "linux.systemctl_restart",
            serde_json::json!({"runners": ["local"], "unit": "cron", "reason": "quickstart: under the grant"}),
        )
    };
    for n in 1..=2 {
        let ran = restart().await.structured_content.unwrap();
        assert_eq!(ran["results"][0]["ok"], true, "{ran}");
        assert_eq!(ran["grant"]["grant_id"], grant, "{ran}");
        assert_eq!(ran["grant"]["use"], n, "{ran}");
        assert_eq!(crate::approvals::restarts(&record), n, "{ran}");
    }
    // Both uses are spent: a third restart would be asked of people, as before the grant.
    let grants = call(
        &client,
        "emisar.grants",
        serde_json::json!({"reason": "how much is left"}),
    )
    .await
    .structured_content
    .unwrap();
    let grants = &grants["results"][0]["output"]["grants"];
    assert_eq!(grants[0]["grant_id"], grant, "{grants}");
    assert_eq!(grants[0]["status"], "active", "{grants}");
    assert_eq!(grants[0]["calls_left"], 0, "{grants}");
    assert_eq!(crate::approvals::restarts(&record), 2);
}

/// `emisar dev --policy FILE` runs under that policy (docs/getting-started.md): a tool the
/// file does not give the dev agent is not the agent's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emisar_dev_runs_under_a_given_policy() {
    let state = tempfile::tempdir().unwrap();
    let policy = state.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "agents:\n  dev-agent:\n    tools: [\"linux.uptime\"]\n",
    )
    .unwrap();
    let (child, info) = start_dev_with(
        &state.path().join("dev"),
        Stdio::null(),
        &["--policy", policy.to_str().unwrap(), "--no-witness"],
    )
    .await;
    let dev = Stop(child);
    // `--no-witness`: no log key, no witness.
    assert!(
        info["witness_url"].is_null() && info["log_key"].is_null(),
        "{info}"
    );
    assert!(!state.path().join("dev").join("log.key").exists());
    use rmcp::ServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let config =
        StreamableHttpClientTransportConfig::with_uri(info["mcp_url"].as_str().unwrap().to_owned())
            .auth_header(info["agent_token"].as_str().unwrap().to_owned());
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.unwrap();
    // A tool outside the policy is not even listed to the agent.
    let tools: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(tools.contains(&"linux.uptime".to_owned()), "{tools:?}");
    assert!(!tools.contains(&"traefik.ping".to_owned()), "{tools:?}");
    let res = call(
        &client,
        "linux.uptime",
        serde_json::json!({"runners": ["local"], "reason": "inside the policy"}),
    )
    .await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    client.cancel().await.unwrap();
    drop(dev);

    // A policy that does not check stops the start, naming the file.
    std::fs::write(&policy, "agents:\n  dev-agent:\n    tools: [\"nope.*\"]\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["dev", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state.path().join("dev"))
        .arg("--policy")
        .arg(&policy)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("policy.yaml"), "{err}");
}

/// A stdio-only MCP client reaches the server through `emisar mcp-stdio`, under its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_stdio_bridges_a_stdio_client() {
    use rmcp::ServiceExt;
    let app = spawn_app(
        Backend::Sqlite,
        vec![RunnerSpec::new("node-1")],
        Options {
            packs_dir: Some(crate::mcp_calls::fixtures_dir()),
            ..Default::default()
        },
    )
    .await;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_emisar"));
    cmd.args(["mcp-stdio", "--url", &app.mcp_url])
        .env("EMISAR_TOKEN", &app.token);
    let client = ().serve(rmcp::transport::TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "testkit.echo"));
    let res = call(
        &client,
        "testkit.echo",
        serde_json::json!({"runners": ["node-1"], "reason": "via stdio", "word": "bridged"}),
    )
    .await;
    assert_eq!(
        res.structured_content.unwrap()["results"][0]["output"]["said"],
        "bridged"
    );
    let events = app
        .events(emisar::server::audit::AuditFilter {
            tool: Some("testkit.echo".into()),
            ..Default::default()
        })
        .await;
    assert_eq!(
        events[0].actor, "agent:test-agent",
        "the bridge acts under the token's identity"
    );
    assert_eq!(events[0].reason.as_deref(), Some("via stdio"));
    client.cancel().await.unwrap();

    // A bad token: the bridge says why and exits non-zero.
    let out = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["mcp-stdio", "--url", &app.mcp_url, "--token", "emt_nope"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("failed to connect to the emisar server"),
        "{err}"
    );
}

/// MCP Inspector's CLI (a client not written here) lists and calls tools of `emisar dev`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_inspector_lists_and_calls_tools_of_emisar_dev() {
    let inspector = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/mcp-inspector");
    let state = tempfile::tempdir().unwrap();
    let (mut child, info) = start_dev(state.path(), Stdio::null()).await;
    let url = info["mcp_url"].as_str().unwrap().to_owned();
    let auth = format!(
        "Authorization: Bearer {}",
        info["agent_token"].as_str().unwrap()
    );
    let storage = tempfile::tempdir().unwrap();
    let inspect = |extra: &[&str]| {
        let mut c = tokio::process::Command::new("bash");
        c.arg(&inspector)
            .args(["--cli", &url, "--header", &auth])
            .args(extra)
            .env("MCP_STORAGE_DIR", storage.path())
            .env("HOME", storage.path());
        c.output()
    };
    let out = inspect(&["--method", "tools/list"]).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "inspector failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for tool in [
        "linux.uptime",
        "traefik.ping",
        "nomad.task_resources_set",
        "emisar.runners",
    ] {
        assert!(names.contains(&tool), "{tool} in {names:?}");
    }
    let out = inspect(&[
        "--method",
        "tools/call",
        "--tool-name",
        "linux.uptime",
        "--tool-arg",
        "runners=[\"local\"]",
        "reason=\"inspector check\"",
    ])
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "inspector call failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["isError"], false, "{result}");
    assert!(
        result["structuredContent"]["results"][0]["output"]["booted_at"].is_string(),
        "{result}"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap();
}

/// `emisar join-token issue|list|revoke` and `emisar runner list|remove`, as an operator runs
/// them, on both stores.
async fn join_tokens_and_runners_from_the_cli(backend: Backend) {
    let app = spawn_app(backend, vec![RunnerSpec::new("local")], Options::default()).await;
    let db = app.database_url.as_str();
    let key = app.public_key.to_str().unwrap();
    let issue = |extra: &[&str]| {
        let mut args = vec!["join-token", "issue", "--database", db];
        args.extend_from_slice(extra);
        emisar(&args)
    };

    // Bad input names the flag and the rule.
    for (extra, why) in [
        (vec!["--uses", "0"], "--uses must be between 1 and"),
        (vec!["--ttl", "31d"], "--ttl must be between 1s and 30d"),
        (vec!["--label", "role"], "--label `role` must be key=value"),
        (vec!["--name", "a b"], "--name `a b` must be an identifier"),
        (
            vec!["--name-pattern", "edge/*"],
            "--name-pattern `edge/*` may hold only",
        ),
        (
            vec!["--name", "a", "--name-pattern", "b"],
            "cannot be used with",
        ),
    ] {
        let mut args = extra.clone();
        args.extend(["--server-public-key", key]);
        let (code, out, err) = issue(&args);
        assert_eq!(code, 2, "{extra:?}: {out}{err}");
        assert!(err.contains(why), "{extra:?}: {err}");
    }
    let (code, _, err) = issue(&[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--server-config") && err.contains("--server-public-key"),
        "{err}"
    );

    // Issued: the token carries this server's key fingerprint.
    let (code, out, err) = issue(&[
        "--uses",
        "2",
        "--name-pattern",
        "edge-*",
        "--label",
        "role=edge",
        "--pack",
        "nomad",
        "--server-public-key",
        key,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    // Bound to a pattern and granting a pack: nothing to warn about.
    assert!(!err.contains("warning"), "{err}");
    let field = |out: &str, name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {out}"))
            .trim()
            .to_owned()
    };
    let id = field(&out, "join token id:");
    let token = field(&out, "join token:");
    assert!(
        token.ends_with(&format!(".key={}", app.server_pins().key_sha256)),
        "{token}"
    );
    let secret = emisar::protocol::JoinToken::parse(&token)
        .unwrap()
        .secret()
        .to_owned();

    let list = || {
        let (code, out, err) = emisar(&["join-token", "list", "--database", db]);
        assert_eq!(code, 0, "{err}");
        assert!(!out.contains(&secret), "the token itself is never listed");
        out.lines()
            .find(|l| l.starts_with(&id))
            .unwrap_or_else(|| panic!("{id} not in {out}"))
            .to_owned()
    };
    let line = list();
    for part in ["0/2", "pattern edge-*", "role=edge", "nomad", "live"] {
        assert!(line.contains(part), "{part}: {line}");
    }
    let (status, body) = app
        .raw_join(
            &token,
            &serde_json::json!({"name": "edge-1", "url": "http://127.0.0.1:9/", "packs": {}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(list().contains("1/2"));

    // Revoked: no more joins; revoking again has nothing to do.
    let (code, out, err) = emisar(&["join-token", "revoke", &id, "--database", db]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&format!("revoked join token {id}")), "{out}");
    let (code, _, err) = emisar(&["join-token", "revoke", &id, "--database", db]);
    assert_eq!(code, 1);
    assert!(err.contains("no unrevoked join token"), "{err}");
    assert!(list().ends_with("revoked"));
    let (status, body) = app
        .raw_join(
            &token,
            &serde_json::json!({"name": "edge-2", "url": "http://127.0.0.1:9/", "packs": {}}),
        )
        .await;
    assert_eq!(status, 401, "{body}");

    // The server's config is another source of the key (and of the configured runners; the
    // test's runner speaks plain HTTP on loopback, which the config must allow).
    let config = app.dir.path().join("emisar.toml");
    std::fs::write(
        &config,
        format!(
            "signing_key_file = \"{}\"\ninsecure_http = true\n[[runners]]\nname = \"local\"\nurl = \"{}\"\n",
            app.private_key.display(),
            app.runner_urls["local"]
        ),
    )
    .unwrap();
    let (code, out, err) = issue(&["--server-config", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    // Any name, no pack: the operator is told what that lets the holder do.
    assert!(
        err.contains("warning: this token admits ANY runner name")
            && err.contains("warning: this token grants no pack"),
        "{err}"
    );
    assert_eq!(field(&out, "packs:"), "none");
    assert!(
        field(&out, "join token:").ends_with(&format!(".key={}", app.server_pins().key_sha256))
    );
    // With the server's config at hand, a pack it does not have is a typo.
    let (code, out, err) = issue(&[
        "--server-config",
        config.to_str().unwrap(),
        "--pack",
        "nomadd",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("--pack nomadd: the server has no such pack"),
        "{err}"
    );

    // Runners: configured and joined; only joined ones can be removed.
    let (code, out, err) = emisar(&[
        "runner",
        "list",
        "--server-config",
        config.to_str().unwrap(),
        "--database",
        db,
    ]);
    assert_eq!(code, 0, "{err}");
    let row = |out: &str, name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {out}"))
            .to_owned()
    };
    assert!(row(&out, "local").contains("config"), "{out}");
    let edge = row(&out, "edge-1");
    assert!(
        edge.contains("joined")
            && edge.contains("http://127.0.0.1:9/")
            && edge.contains("role=edge"),
        "{edge}"
    );
    let (code, out, err) = emisar(&["runner", "list", "--database", db]);
    assert_eq!(code, 0);
    assert!(!out.contains("local "), "{out}");
    assert!(err.contains("--server-config"), "{err}");
    let (code, _, err) = emisar(&["runner", "remove", "local", "--database", db]);
    assert_eq!(code, 1);
    assert!(err.contains("no joined runner is named local"), "{err}");
    let (code, out, err) = emisar(&["runner", "remove", "edge-1", "--database", db]);
    assert_eq!(code, 0, "{out}{err}");
    let (_, out, _) = emisar(&["runner", "list", "--database", db]);
    assert!(!out.contains("edge-1"), "{out}");
    let (code, _, _) = emisar(&["runner", "remove", "edge-1", "--database", db]);
    assert_eq!(code, 1);
    let (code, _, err) = emisar(&["runner"]);
    assert_eq!(code, 2);
    assert!(err.contains("--config runner.toml"), "{err}");

    // What changed is audited, by the CLI user.
    for (kind, count) in [
        ("join_token.issued", 2),
        ("join_token.revoked", 1),
        ("runner.removed", 1),
    ] {
        let events = app
            .events(emisar::server::audit::AuditFilter {
                kind: Some(kind.into()),
                ..Default::default()
            })
            .await;
        assert_eq!(events.len(), count, "{kind}");
        assert!(events.iter().all(|e| e.actor.starts_with("cli:")), "{kind}");
    }
}
crate::both_backends!(join_tokens_and_runners_from_the_cli);

/// `emisar` with `stdin` on its standard input.
fn emisar_stdin(args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(args)
        .env_remove("DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `emisar token list` and `emisar user list|set-role|set-password`, as an administrator runs
/// them: lists never show a secret, a change ends the person's sessions, and is audited.
async fn people_administration_from_the_cli(backend: Backend) {
    let app = spawn_app(backend, vec![RunnerSpec::new("local")], Options::default()).await;
    let db = app.database_url.as_str();
    let (code, out, err) = emisar_stdin(
        &[
            "user",
            "add",
            "alice",
            "--role",
            "approver",
            "--password-stdin",
            "--database",
            db,
        ],
        "first-password-1\n",
    );
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = emisar(&["user", "token", "alice", "--database", db]);
    assert_eq!(code, 0, "{out}{err}");
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("token:"))
        .unwrap()
        .trim()
        .to_owned();

    // token list: the id, name, role, state; never the token nor its hash.
    let (code, out, err) = emisar(&["token", "list", "--database", db]);
    assert_eq!(code, 0, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "ID", "NAME", "ROLE", "SELECTOR", "CREATED", "EXPIRES", "STATE"
        ]
    );
    let alice = out
        .lines()
        .find(|l| l.contains(" alice "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        alice.contains("approver") && alice.ends_with("live"),
        "{alice}"
    );
    let hash = emisar::digest::sha256_hex(token.as_bytes());
    assert!(!out.contains(&token) && !out.contains(&hash), "{out}");

    // A session, then a role change: the session ends and the token (which carries the old
    // role) is revoked, and the command says so.
    let (_, session) =
        emisar::server::users::login(&app.db, &app.audit, "alice", "first-password-1")
            .await
            .unwrap();
    let (_, out, _) = emisar(&["user", "list", "--database", db]);
    let row = out
        .lines()
        .find(|l| l.starts_with("alice "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains("approver") && row.ends_with(" 1"), "{row}");
    assert!(!out.contains("argon2"), "{out}");
    let (code, _, err) = emisar(&[
        "user",
        "set-role",
        "alice",
        "--role",
        "agent",
        "--database",
        db,
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("`role` must be approver, auditor or admin"),
        "{err}"
    );
    let (code, out, err) = emisar(&[
        "user",
        "set-role",
        "alice",
        "--role",
        "admin",
        "--database",
        db,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "alice is now admin: 1 portal session(s) ended, 1 API token(s) revoked"
    );
    assert!(
        emisar::server::users::session(&app.db, &session)
            .await
            .unwrap()
            .is_none()
    );
    let (_, out, _) = emisar(&["token", "list", "--database", db]);
    let alice = out.lines().find(|l| l.contains(" alice ")).unwrap();
    assert!(alice.ends_with("revoked"), "{alice}");
    let (_, out, _) = emisar(&["user", "list", "--database", db]);
    let row = out.lines().find(|l| l.starts_with("alice ")).unwrap();
    assert!(row.contains("admin") && row.ends_with(" 0"), "{row}");

    // A password change: the old password stops working, sessions end.
    let _ = emisar::server::users::login(&app.db, &app.audit, "alice", "first-password-1")
        .await
        .unwrap();
    let (code, _, err) = emisar_stdin(
        &["user", "set-password", "alice", "--database", db],
        "short\n",
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("`password` must be at least 12 characters"),
        "{err}"
    );
    let (code, _, err) = emisar_stdin(
        &["user", "set-password", "bob", "--database", db],
        "second-password-2\n",
    );
    assert_eq!(code, 2);
    assert!(err.contains("there is no user `bob`"), "{err}");
    let (code, out, err) = emisar_stdin(
        &["user", "set-password", "alice", "--database", db],
        "second-password-2\n",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "password of alice changed: 1 portal session(s) ended"
    );
    assert!(
        emisar::server::users::login(&app.db, &app.audit, "alice", "first-password-1")
            .await
            .is_err()
    );
    emisar::server::users::login(&app.db, &app.audit, "alice", "second-password-2")
        .await
        .unwrap();

    for kind in ["user.role_changed", "user.password_changed"] {
        let events = app
            .events(emisar::server::audit::AuditFilter {
                kind: Some(kind.into()),
                ..Default::default()
            })
            .await;
        assert_eq!(events.len(), 1, "{kind}");
        assert!(events[0].actor.starts_with("cli:"), "{kind}");
        let detail = events[0].detail.as_ref().unwrap().to_string();
        assert!(
            detail.contains("alice") && !detail.contains("password-"),
            "{detail}"
        );
    }
}
crate::both_backends!(people_administration_from_the_cli);

/// `emisar token list` tells a token past its `expires_at` from a live one (and a revoked
/// one from both): the state is what an administrator acts on.
async fn token_list_says_which_tokens_have_expired(backend: Backend) {
    use emisar::server::principal::Role;
    use emisar::server::tokens;
    let app = spawn_app(backend, vec![], Options::default()).await;
    let db = app.database_url.as_str();
    let second = Duration::from_secs(1);
    let year = Duration::from_secs(365 * 86_400);
    for (name, ttl) in [("brief-agent", second), ("long-agent", year)] {
        tokens::issue(&app.db, &app.audit, name, Role::Agent, ttl, "test")
            .await
            .unwrap();
    }
    let gone = tokens::issue(&app.db, &app.audit, "gone-agent", Role::Agent, year, "test")
        .await
        .unwrap();
    assert!(
        tokens::revoke(&app.db, &app.audit, &gone.id, "test")
            .await
            .unwrap()
    );
    tokio::time::sleep(second + Duration::from_millis(100)).await;
    let (code, out, err) = emisar(&["token", "list", "--database", db]);
    assert_eq!(code, 0, "{err}");
    let state = |name: &str| {
        let row = out
            .lines()
            .find(|l| l.contains(&format!(" {name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{out}"));
        row.split_whitespace().last().unwrap().to_owned()
    };
    assert_eq!(state("brief-agent"), "expired", "{out}");
    assert_eq!(state("long-agent"), "live", "{out}");
    assert_eq!(state("gone-agent"), "revoked", "{out}");
}
crate::both_backends!(token_list_says_which_tokens_have_expired);

/// Writes `text` to `path` and runs `emisar config check` on it (with `--kind` if given).
fn config_check(path: &std::path::Path, text: &str, kind: Option<&str>) -> (i32, String, String) {
    std::fs::write(path, text).unwrap();
    let path = path.to_str().unwrap();
    match kind {
        Some(kind) => emisar(&["config", "check", "--kind", kind, path]),
        None => emisar(&["config", "check", path]),
    }
}

/// `emisar config check`: `ok` for a good file of either kind (told apart by its keys), and
/// every problem, each naming its key, for a bad one.
#[test]
fn config_check_reports_every_problem_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("server.key");
    let public = dir.path().join("server.pub");
    emisar::protocol::signing::write_keypair(&key, &public).unwrap();
    let server = dir.path().join("emisar.toml");
    let (code, out, err) = config_check(
        &server,
        &format!("listen = \"127.0.0.1:0\"\nsigning_key_file = {:?}\n", key),
        None,
    );
    assert_eq!(
        (code, out.trim()),
        (
            0,
            format!("ok: {} (server config)", server.display()).as_str()
        ),
        "{err}"
    );

    let runner = dir.path().join("runner.toml");
    let state = dir.path().join("state");
    let (code, out, err) = config_check(
        &runner,
        &format!(
            "name = \"edge1\"\nlisten = \"127.0.0.1:7701\"\nserver_public_key_file = {public:?}\nstate_dir = {state:?}\n"
        ),
        None,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("(runner config)"), "{out}");

    // A bad server config: a missing key file, a policy that does not exist, a bad listen.
    let (code, out, _) = config_check(
        &server,
        "listen = \"localhost\"\nsigning_key_file = \"/nonexistent/server.key\"\npolicy_file = \"/nonexistent/policy.toml\"\ncall_timeout_ms = 0\n",
        Some("server"),
    );
    assert_eq!(code, 1, "{out}");
    for key in [
        "call_timeout_ms",
        "listen `localhost`",
        "signing_key_file: cannot read",
        "policy_file:",
    ] {
        assert!(out.contains(key), "{key}: {out}");
    }
    // An unknown key names itself.
    let (code, out, _) = config_check(
        &server,
        &format!("signing_key_file = {key:?}\nlisten_addr = \"x\"\n"),
        None,
    );
    assert_eq!(code, 1);
    assert!(out.contains("listen_addr"), "{out}");

    // A top-level key appended after `[allowlists]`: TOML reads it as part of that table, and
    // the error says so instead of only "expected a sequence".
    let (code, out, _) = config_check(
        &runner,
        &format!(
            "name = \"edge1\"\nlisten = \"127.0.0.1:7701\"\nserver_public_key_file = {public:?}\nstate_dir = {state:?}\n\n[allowlists]\nsystemd_units = [\"consul\"]\napprovers_file = \"/etc/emisar/approvers\"\n"
        ),
        None,
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("`approvers_file` is a top-level key, but it comes after the `[allowlists]` header, so TOML reads it as `allowlists.approvers_file`"),
        "{out}"
    );

    // A joining runner on a wildcard address without advertise_url; a key file that is not
    // a key.
    let (code, out, _) = config_check(
        &runner,
        &format!(
            "name = \"edge1\"\nlisten = \"0.0.0.0:7701\"\nserver_public_key_file = {server:?}\nstate_dir = {state:?}\n[join]\nserver = \"https://emisar.example\"\n"
        ),
        None,
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("advertise_url is required"), "{out}");
    assert!(out.contains("server_public_key_file"), "{out}");

    // Witnesses a runner would refuse at start (the red team's F4): the log's own key, one
    // key twice, a quorum of 0; and a server whose witnesses include its log's key (F3).
    let log = emisar::tlog::keys::NoteKey::generate("emisar.test/audit").unwrap();
    let w = emisar::tlog::keys::NoteKey::generate("witness.test/w1").unwrap();
    for (keys, quorum, says) in [
        (
            vec![log.verifier_key()],
            1,
            "witness_keys[0]: a witness key must be a cosignature/v1 key",
        ),
        (
            vec![log.cosigner_key()],
            1,
            "witness_keys[0]: this is the log's own key",
        ),
        (
            vec![w.cosigner_key(), w.cosigner_key()],
            2,
            "witness_keys[1]: the same key as an earlier witness",
        ),
        (
            vec![w.cosigner_key()],
            0,
            "witness_quorum: 0 must be between 1",
        ),
    ] {
        let (code, out, _) = config_check(
            &runner,
            &format!(
                "name = \"edge1\"\nlisten = \"127.0.0.1:7701\"\nserver_public_key_file = {public:?}\nstate_dir = {state:?}\nrequire_witnessed = true\nlog_key = {:?}\nwitness_keys = {keys:?}\nwitness_quorum = {quorum}\n",
                log.verifier_key()
            ),
            None,
        );
        assert_eq!(code, 1, "{out}");
        assert!(out.contains(says), "{says}: {out}");
    }
    let log_key = dir.path().join("log.key");
    emisar::util::files::create_private(&log_key, log.private_text().as_bytes()).unwrap();
    let (code, out, _) = config_check(
        &server,
        &format!(
            "listen = \"127.0.0.1:0\"\nsigning_key_file = {key:?}\n[transparency]\nlog_key_file = {log_key:?}\n[[transparency.witnesses]]\nurl = \"http://127.0.0.1:9\"\nkey = {:?}\n",
            log.cosigner_key()
        ),
        None,
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("transparency.witnesses[0]: this is the log's own key"),
        "{out}"
    );

    // Neither kind's keys: ask for --kind; a wrong --kind names the valid ones.
    let (code, _, err) = config_check(&runner, "listen = \"127.0.0.1:1\"\n", None);
    assert_eq!(code, 2);
    assert!(err.contains("pass --kind server or --kind runner"), "{err}");
    let (code, _, err) = config_check(&runner, "listen = \"127.0.0.1:1\"\n", Some("db"));
    assert_eq!(code, 2);
    assert!(err.contains("server") && err.contains("runner"), "{err}");
}

/// `emisar audit query|export` against a server's API with an auditor token read what the
/// database holds; `audit verify` there says it needs the database; a kind or outcome that
/// does not exist is an error listing the valid ones; `migrate` on an empty database lists
/// what it applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_cli_reads_a_server_with_an_auditor_token() {
    let app = spawn_app(
        Backend::Postgres,
        vec![RunnerSpec::new("node-1")],
        Options::default(),
    )
    .await;
    let db = app.database_url.as_str();
    let (code, out, err) = emisar(&[
        "token",
        "issue",
        "--agent",
        "auditor1",
        "--role",
        "auditor",
        "--database",
        db,
    ]);
    assert_eq!(code, 0, "{err}");
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("token:"))
        .unwrap()
        .trim()
        .to_owned();
    let server = app.mcp_url.trim_end_matches("/mcp").to_owned();
    let api = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--server", &server, "--token", &token]);
        emisar(&a)
    };
    let (code, by_api, err) = api(&["audit", "query", "--kind", "token.issued", "--json"]);
    assert_eq!(code, 0, "{err}");
    let (_, by_db, _) = emisar(&[
        "audit",
        "query",
        "--kind",
        "token.issued",
        "--json",
        "--database",
        db,
    ]);
    assert_eq!(by_api, by_db);
    assert!(by_api.contains("\"agent\":\"auditor1\""), "{by_api}");
    let (code, by_api, err) = api(&["audit", "export", "--format", "csv"]);
    assert_eq!(code, 0, "{err}");
    let (_, by_db, _) = emisar(&["audit", "export", "--format", "csv", "--database", db]);
    assert_eq!(by_api, by_db);
    assert!(by_api.lines().count() >= 3, "{by_api}");
    // A token that is not an auditor's is refused by the server, and the CLI says so.
    let (code, _, err) = emisar(&["audit", "query", "--server", &server, "--token", &app.token]);
    assert_eq!(code, 2);
    assert!(err.contains("/api/audit"), "{err}");

    let (code, _, err) = api(&["audit", "verify"]);
    assert_eq!(code, 2);
    assert!(err.contains("audit verify needs the database"), "{err}");
    let (code, out, err) = emisar(&[
        "audit",
        "verify",
        "--since",
        "2000-01-01T00:00:00Z",
        "--database",
        db,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ok: "), "{out}");
    let (code, _, err) = emisar(&["audit", "verify", "--since", "5", "--database", db]);
    assert_eq!(code, 2);
    assert!(err.contains("--since"), "{err}");

    for args in [
        ["audit", "query", "--kind", "bogus"],
        ["audit", "export", "--kind", "bogus"],
    ] {
        let (code, _, err) = emisar(&[&args[..], &["--database", db]].concat());
        assert_eq!(code, 2);
        assert!(
            err.contains("`kind` `bogus` is not an event kind") && err.contains("tool.rejected"),
            "{err}"
        );
        let (code, _, err) = api(&args);
        assert_eq!(code, 2);
        assert!(err.contains("`kind` `bogus` is not an event kind"), "{err}");
    }
    let (code, _, err) = emisar(&["audit", "query", "--outcome", "fine", "--database", db]);
    assert_eq!(code, 2);
    assert!(
        err.contains("the outcomes are: ok, refused, error"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let fresh = format!("sqlite://{}", dir.path().join("fresh.db").display());
    let (code, out, err) = emisar(&["migrate", "--database", &fresh]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("applied ") && out.contains("approvals"),
        "{out}"
    );
    let (_, out, _) = emisar(&["migrate", "--database", &fresh]);
    assert_eq!(
        out.trim(),
        "sqlite schema is up to date\naudit tree: 0 events"
    );
    let (code, out, err) = emisar(&["migrate", "--database", db]);
    assert_eq!(code, 0);
    assert!(out.contains("up to date"), "{out}");
    assert!(
        !err.contains("already exists"),
        "PostgreSQL's notice is not logged: {err}"
    );
}

/// `emisar packs list | head -1` and `emisar audit export | head -1`: the reader goes away
/// first, and the command ends quietly with status 0 instead of panicking.
#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("a.db").display());
    let (code, _, err) = emisar(&["migrate", "--database", &db]);
    assert_eq!(code, 0, "{err}");
    for args in [
        vec!["packs", "list"],
        vec!["audit", "export", "--format", "csv", "--database", &db],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_emisar"))
            .args(&args)
            .env_remove("DATABASE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Close the reading end before the command can write: its first write finds the
        // pipe broken.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("error"),
            "{args:?}: {err}"
        );
    }
}
