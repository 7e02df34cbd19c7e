//! Acceptance 1 of signed approvals, in a real browser: headless Chromium through
//! playwright-core, with a virtual authenticator from the DevTools protocol's WebAuthn domain,
//! registers a passkey in the portal (tests/browser/passkey_e2e.mjs); the operator puts it in
//! the approvers file; the server and a runner over TLS that requires signed approvals for
//! `linux.systemctl_restart` start with that file; the person approves the agent's restart
//! with the passkey, and the runner verifies the signature itself and runs it once.
//!
//! The server restarts between registration and approval (on the same database and a
//! reserved port, so the browser's session and origin stay the same), because the server
//! and the runner read the approvers file at start and it must hold the new passkey.
//! Screenshots land in target/passkey-e2e/.

use std::path::{Path, PathBuf};
use std::time::Duration;

use emisar::digest::{canonical_json, json_digest};
use emisar::server::audit::AuditFilter;
use emisar::server::config::WebauthnConfig;
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::approvals::{
    Portal, add_user, call_in_background, restart_args, restarts, signed_in, systemctl_standin,
    wait_for_pending,
};
use crate::harness::app::{Options, TestApp};
use crate::harness::certs::self_signed;
use crate::harness::pg::PgTestDb;
use crate::harness::tools::{DeadEndpoint, require};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::portal_browser::{CHROMIUM, Driver, assert_png, require_path};

const TOOL: &str = "linux.systemctl_restart";

/// A portal where Alice registers a passkey in the browser (the driver's first part), on a
/// port held for the server that follows.
struct Registration {
    backend: Backend,
    work: tempfile::TempDir,
    bin: tempfile::TempDir,
    /// The stand-in `systemctl`'s record of what it was asked.
    record: PathBuf,
    port: u16,
    origin: String,
    webauthn: WebauthnConfig,
    first: TestApp,
    driver: Driver,
    shots: PathBuf,
}

impl Registration {
    /// Starts the first server on `backend` and the driver (`env` added to its own).
    async fn start(backend: Backend, shots: &str, env: &[(&str, String)]) -> Registration {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let node = require("node/bin/node");
        let chromium = require_path(Path::new(CHROMIUM));
        require_path(&repo.join("tests/browser/node_modules/playwright-core/package.json"));
        let work = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let record = systemctl_standin(bin.path());

        // The portal's port is held until each server binds it: the origin a passkey signs
        // for names it, so both servers must be reached at the same one.
        let port = DeadEndpoint::bind_reserved().release();
        let origin = format!("http://localhost:{port}");
        let webauthn = WebauthnConfig {
            rp_id: Some("localhost".into()),
            origins: vec![origin.clone()],
        };
        let first = spawn_app(
            backend,
            vec![],
            Options {
                listen: Some(format!("127.0.0.1:{port}")),
                webauthn: Some(webauthn.clone()),
                ..Default::default()
            },
        )
        .await;
        let password = add_user(&first, "alice", Role::Approver).await;

        let shots = repo.join("target").join(shots);
        std::fs::create_dir_all(&shots).unwrap();
        let mut vars = vec![
            ("PORTAL_URL", format!("{origin}/")),
            ("PORTAL_USER", "alice".into()),
            ("PORTAL_PASSWORD", password),
            ("SCREENSHOT_DIR", shots.display().to_string()),
            ("CHROMIUM", chromium.display().to_string()),
            ("TMPDIR", work.path().display().to_string()),
        ];
        vars.extend(env.iter().cloned());
        let driver = Driver::spawn(&repo, &node, "tests/browser/passkey_e2e.mjs", &vars);
        Registration {
            backend,
            work,
            bin,
            record,
            port,
            origin,
            webauthn,
            first,
            driver,
            shots,
        }
    }

    /// The passkey registered in the browser goes into the operator's approvers file (Alice,
    /// one signature for everything, the portal it was registered through); the server
    /// restarts with it on the same database and port, with a runner over TLS that requires
    /// signed approvals for `linux.systemctl_restart`. Returns the new server and the
    /// passkey's credential id.
    async fn restart_with_the_passkey(&mut self, options: Options) -> (TestApp, String) {
        // 1. Registered in the browser: the server stored the key the authenticator made.
        let registered = self.driver.expect_json("{\"registered\": ID}").await;
        let keys = emisar::server::passkeys::of_user(&self.first.db, "alice")
            .await
            .unwrap();
        assert_eq!(keys.len(), 1, "{keys:?}");
        assert_eq!(
            registered["registered"],
            keys[0].credential_id,
            "{}",
            self.driver.transcript()
        );

        // 2. The operator's approvers file.
        let approvers = self.work.path().join("approvers.toml");
        std::fs::write(
            &approvers,
            format!(
                "serial = 1\n\n[webauthn]\nrp_id = \"localhost\"\norigins = [\"{}\"]\n\n\
                 [[person]]\nname = \"alice\"\npasskeys = [{{ id = \"{}\", alg = \"{}\", public_key = \"{}\" }}]\n\n\
                 [[rule]]\ntools = \"*\"\napprovals = 1\n",
                self.origin,
                keys[0].credential_id,
                keys[0].alg.as_str(),
                keys[0].public_key
            ),
        )
        .unwrap();
        self.first.stop().await;
        let state = self.work.path().join("runner-state");
        std::fs::create_dir_all(&state).unwrap();
        let cert = self_signed(self.work.path(), "hvn05");
        let app = spawn_app(
            self.backend,
            vec![
                RunnerSpec::new("hvn05")
                    .path_first(self.bin.path())
                    .allow("systemd_units", &["consul", "nomad"])
                    .https(cert.clone(), Some(cert.fingerprint.to_string()))
                    .require_signed(&[TOOL], approvers.clone(), state),
            ],
            Options {
                listen: Some(format!("127.0.0.1:{}", self.port)),
                database_url: Some(self.first.database_url.clone()),
                keys: Some((
                    self.first.private_key.clone(),
                    self.first.public_key.clone(),
                )),
                webauthn: Some(self.webauthn.clone()),
                approvers_file: Some(approvers),
                insecure_http: Some(false),
                ..options
            },
        )
        .await;
        assert!(app.runner_urls["hvn05"].starts_with("https://"));
        (app, keys[0].credential_id.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passkey_registered_in_the_browser_approves_a_restart_the_runner_verifies() {
    let work = tempfile::tempdir().unwrap();
    let go = work.path().join("go");
    let mut lab = Registration::start(
        Backend::Sqlite,
        "passkey-e2e",
        &[("GO_FILE", go.display().to_string())],
    )
    .await;

    let run = async {
        let (app, credential_id) = lab.restart_with_the_passkey(Options::default()).await;

        // 3. The agent asks; Alice approves with the passkey in the browser.
        let client = app.mcp_client().await;
        let call = call_in_background(&client, TOOL, restart_args("consul wedged on hvn05"));
        std::fs::write(&go, b"go").unwrap();
        let driver = &mut lab.driver;
        let approved = driver
            .expect_json("{\"approved\": ID, \"state\": \"executed\"}")
            .await;
        assert_eq!(approved["state"], "executed", "{}", driver.transcript());
        let status = driver.wait_exit().await;
        assert!(status.success(), "{status}\n{}", driver.transcript());
        let res = call.await.expect("the agent's call completes");
        client.cancel().await.unwrap();
        (app, approved, res, credential_id)
    };
    let (app, approved, res, credential_id) =
        match tokio::time::timeout(Duration::from_secs(150), run).await {
            Ok(out) => out,
            Err(_) => panic!(
                "the passkey browser test did not finish within 150 s\n{}",
                lab.driver.transcript()
            ),
        };

    // The runner ran the restart once, with the passkey's signature.
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(restarts(&lab.record), 1, "exactly one restart ran");
    let id = approved["approved"].as_str().unwrap();
    let trail = app
        .events(AuditFilter {
            approval_id: Some(id.into()),
            ..Default::default()
        })
        .await;
    let approval = trail
        .iter()
        .find(|e| e.kind == "approval.approved")
        .unwrap_or_else(|| panic!("no approval.approved in {trail:?}"));
    // The signature is recorded with the approval: the passkey that made it.
    let detail = approval.detail.clone().unwrap_or(json!(null)).to_string();
    assert!(detail.contains(&credential_id), "{detail}");
    assert!(trail.iter().any(|e| e.kind == "call.executed"), "{trail:?}");
    app.verify_with_cli();
    for name in ["01-registered.png", "02-statement.png", "03-executed.png"] {
        assert_png(&lab.shots.join(name));
    }
}

/// What people see is what they sign, in the portal: a database writer (PostgreSQL's
/// superuser) edits the stored request so that the statement covers another write than the
/// page shows: the arguments the runner would receive (nomad) with the statement's digest of
/// them recomputed, while the request shows consul; then a far-future expiry. The page
/// recomputes every line of the statement in the browser before it asks the passkey, refuses
/// each naming the field, and the authenticator signs nothing (its signature count stays), no
/// vote counts. The request as it was is signed, counts and runs: consul, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_portal_signs_only_what_it_shows() {
    let work = tempfile::tempdir().unwrap();
    let steps = work.path().join("steps");
    std::fs::create_dir_all(&steps).unwrap();
    let mut lab = Registration::start(
        Backend::Postgres,
        "passkey-what-you-sign",
        &[("STEPS_DIR", steps.display().to_string())],
    )
    .await;

    let run = async {
        let (app, credential_id) = lab
            .restart_with_the_passkey(Options {
                // The agent's call waits for the whole test, so it sees the outcome.
                approval_wait_secs: Some(300),
                ..Default::default()
            })
            .await;
        let watcher = signed_in(&app, "carol", Role::Approver).await;
        let client = app.mcp_client().await;
        let call = call_in_background(&client, TOOL, restart_args("consul wedged on hvn05"));
        let id = wait_for_pending(&watcher).await;
        let (_, request) = watcher.get(&format!("/api/approvals/{id}")).await;
        let text = request["statement"]["text"].as_str().unwrap().to_owned();
        let line = |key: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{key} ")))
                .unwrap_or_else(|| panic!("no `{key}` line in {text}"))
                .to_owned()
        };
        // What the runner would receive, as stored; the edits change it and put it back.
        let pg = lab
            .first
            .pg
            .as_ref()
            .expect("the database the first server made");
        let stored = pg
            .superuser_sql(&format!(
                "SELECT args::text FROM approvals WHERE id = '{id}'"
            ))
            .unwrap();
        let stored: Value = serde_json::from_str(stored.trim()).unwrap();
        assert_eq!(stored["unit"], "consul", "{stored}");
        let mut nomad = stored.clone();
        nomad["unit"] = json!("nomad");
        let edits = [
            // The runner would receive nomad, and the statement's digest of its arguments
            // says nomad; the page shows consul (the request's shown args, as audited).
            (
                nomad.clone(),
                text.replace(
                    &line("args"),
                    &format!("args sha256:{}", json_digest(&nomad)),
                ),
                "`args`: `unit` is \"nomad\" in the statement and \"consul\" in the request shown",
            ),
            // An approval that lives until 2099.
            (
                stored.clone(),
                text.replace(&line("expires"), "expires 2099-01-01T00:00:00Z"),
                "`expires`: the approval lives",
            ),
        ];
        let driver = &mut lab.driver;
        for (step, (args, statement, says)) in edits.iter().enumerate() {
            set_request(pg, &id, args, statement);
            next_step(&steps, step + 1, "refuse");
            let out = driver.expect_json("{\"step\": N, \"refused\": …}").await;
            let context = format!("step {} ({says}): {out}\n{}", step + 1, driver.transcript());
            // The page said why, before the click and at it, naming the field.
            let before = out["shown"]["refused"].as_str().unwrap_or_default();
            assert!(before.contains(says), "{context}");
            let error = out["refused"].as_str().unwrap_or_default();
            assert!(
                error.contains(says) && error.ends_with(": not signed"),
                "{context}"
            );
            // The authenticator was never asked, and nothing counts.
            assert_eq!(out["sign_count"][0], out["sign_count"][1], "{context}");
            assert_eq!(out["state"], "pending", "{context}");
            no_vote(&watcher, &id, &context).await;
        }

        // The request as it was: the page shows what is signed, the passkey signs, it counts
        // and runs.
        set_request(pg, &id, &stored, &text);
        next_step(&steps, 3, "approve");
        let out = driver.expect_json("{\"step\": 3, \"approved\": …}").await;
        let context = format!("{out}\n{}", driver.transcript());
        assert_eq!(out["approved"], id.as_str(), "{context}");
        assert_eq!(out["state"], "executed", "{context}");
        assert_eq!(out["shown"]["refused"], Value::Null, "{context}");
        assert_eq!(
            out["shown"]["args"],
            canonical_json(&request["statement"]["args"]),
            "{context}"
        );
        assert_eq!(out["shown"]["required"], "1", "{context}");
        assert_eq!(
            out["shown"]["expires"],
            line("expires").trim_start_matches("expires "),
            "{context}"
        );
        assert!(
            out["shown"]["runners"]
                .as_str()
                .is_some_and(|r| r.starts_with("hvn05")),
            "{context}"
        );
        let counts = out["sign_count"].as_array().unwrap();
        assert_eq!(
            counts[1].as_u64(),
            counts[0].as_u64().map(|n| n + 1),
            "one signature: {context}"
        );
        next_step(&steps, 4, "done");
        let status = driver.wait_exit().await;
        assert!(status.success(), "{status}\n{}", driver.transcript());
        let res = call.await.expect("the agent's call completes");
        client.cancel().await.unwrap();
        (app, watcher, id, res, credential_id)
    };
    let (app, watcher, id, res, credential_id) =
        match tokio::time::timeout(Duration::from_secs(240), run).await {
            Ok(out) => out,
            Err(_) => panic!(
                "the passkey browser test did not finish within 240 s\n{}",
                lab.driver.transcript()
            ),
        };

    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    // One restart, of consul: the unit the page showed and the passkey signed.
    assert_eq!(restarts(&lab.record), 1, "exactly one restart ran");
    let argv = std::fs::read_to_string(&lab.record).unwrap();
    assert!(
        argv.lines().any(|l| l == "restart -- consul") && !argv.contains("nomad"),
        "{argv}"
    );
    let (_, row) = watcher.get(&format!("/api/approvals/{id}")).await;
    let votes = row["approvals"].as_array().unwrap();
    assert_eq!(votes.len(), 1, "{row}");
    assert_eq!(votes[0]["user"], "alice", "{row}");
    let trail = app
        .events(AuditFilter {
            approval_id: Some(id.clone()),
            ..Default::default()
        })
        .await;
    let approved: Vec<_> = trail
        .iter()
        .filter(|e| e.kind == "approval.approved")
        .collect();
    assert_eq!(approved.len(), 1, "{trail:?}");
    let detail = approved[0]
        .detail
        .clone()
        .unwrap_or(json!(null))
        .to_string();
    assert!(detail.contains(&credential_id), "{detail}");
    app.verify_with_cli();
    for name in [
        "11-step-refuse.png",
        "12-step-refuse.png",
        "13-step-approve.png",
    ] {
        assert_png(&lab.shots.join(name));
    }
}

/// Writes a stored request's runner arguments and statement, as a database writer would.
fn set_request(pg: &PgTestDb, id: &str, args: &Value, statement: &str) {
    let sql = format!(
        "UPDATE approvals SET args = '{}'::jsonb, statement = '{}' WHERE id = '{id}'",
        args.to_string().replace('\'', "''"),
        statement.replace('\'', "''")
    );
    pg.superuser_sql(&sql).unwrap();
}

/// The request is still pending, with no vote.
async fn no_vote(watcher: &Portal, id: &str, context: &str) {
    let (_, row) = watcher.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(row["state"], "pending", "{row}\n{context}");
    assert_eq!(
        row["approvals"],
        json!([]),
        "no vote counts: {row}\n{context}"
    );
}

/// Tells the browser driver its step `n`: written under another name and renamed, since the
/// driver reads the file as soon as it exists (a plain write once let it read it empty).
fn next_step(dir: &std::path::Path, n: usize, action: &str) {
    let tmp = dir.join(format!("{n}.tmp"));
    std::fs::write(&tmp, action).unwrap();
    std::fs::rename(&tmp, dir.join(n.to_string())).unwrap();
}
