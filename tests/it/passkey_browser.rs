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

use emisar::server::audit::AuditFilter;
use emisar::server::config::WebauthnConfig;
use emisar::server::tokens::Role;
use serde_json::json;

use crate::approvals::{add_user, call_in_background, restart_args, restarts, systemctl_standin};
use crate::harness::app::Options;
use crate::harness::certs::self_signed;
use crate::harness::tools::{DeadEndpoint, require};
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::portal_browser::{CHROMIUM, Driver, assert_png, require_path};

const TOOL: &str = "linux.systemctl_restart";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passkey_registered_in_the_browser_approves_a_restart_the_runner_verifies() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let node = require("node/bin/node");
    let chromium = require_path(Path::new(CHROMIUM));
    require_path(&repo.join("tests/browser/node_modules/playwright-core/package.json"));
    let work = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());

    // The portal's port is held until each server binds it: the origin a passkey signs for
    // names it, so both servers must be reached at the same one.
    let port = DeadEndpoint::bind_reserved().release();
    let origin = format!("http://localhost:{port}");
    let webauthn = WebauthnConfig {
        rp_id: Some("localhost".into()),
        origins: vec![origin.clone()],
    };
    let mut first = spawn_app(
        Backend::Sqlite,
        vec![],
        Options {
            listen: Some(format!("127.0.0.1:{port}")),
            webauthn: Some(webauthn.clone()),
            ..Default::default()
        },
    )
    .await;
    let password = add_user(&first, "alice", Role::Approver).await;

    let shots = repo.join("target/passkey-e2e");
    std::fs::create_dir_all(&shots).unwrap();
    let go = work.path().join("go");
    let mut driver = Driver::spawn(
        &repo,
        &node,
        "tests/browser/passkey_e2e.mjs",
        &[
            ("PORTAL_URL", format!("{origin}/")),
            ("PORTAL_USER", "alice".into()),
            ("PORTAL_PASSWORD", password),
            ("GO_FILE", go.display().to_string()),
            ("SCREENSHOT_DIR", shots.display().to_string()),
            ("CHROMIUM", chromium.display().to_string()),
            ("TMPDIR", work.path().display().to_string()),
        ],
    );

    let run = async {
        // 1. Registered in the browser: the server stored the key the authenticator made.
        let registered = driver.expect_json("{\"registered\": ID}").await;
        let keys = emisar::server::passkeys::of_user(&first.db, "alice")
            .await
            .unwrap();
        assert_eq!(keys.len(), 1, "{keys:?}");
        assert_eq!(
            registered["registered"],
            keys[0].credential_id,
            "{}",
            driver.transcript()
        );

        // 2. The operator's approvers file: Alice and her passkey, one signature for
        // everything, the portal it was registered through.
        let approvers = work.path().join("approvers.toml");
        std::fs::write(
            &approvers,
            format!(
                "serial = 1\n\n[webauthn]\nrp_id = \"localhost\"\norigins = [\"{origin}\"]\n\n\
                 [[person]]\nname = \"alice\"\npasskeys = [{{ id = \"{}\", alg = \"{}\", public_key = \"{}\" }}]\n\n\
                 [[rule]]\ntools = \"*\"\napprovals = 1\n",
                keys[0].credential_id,
                keys[0].alg.as_str(),
                keys[0].public_key
            ),
        )
        .unwrap();
        first.stop().await;
        let state = work.path().join("runner-state");
        std::fs::create_dir_all(&state).unwrap();
        let cert = self_signed(work.path(), "hvn05");
        let app = spawn_app(
            Backend::Sqlite,
            vec![
                RunnerSpec::new("hvn05")
                    .path_first(bin.path())
                    .allow("systemd_units", &["consul"])
                    .https(cert.clone(), Some(cert.fingerprint.to_string()))
                    .require_signed(&[TOOL], approvers.clone(), state),
            ],
            Options {
                listen: Some(format!("127.0.0.1:{port}")),
                database_url: Some(first.database_url.clone()),
                keys: Some((first.private_key.clone(), first.public_key.clone())),
                webauthn: Some(webauthn.clone()),
                approvers_file: Some(approvers),
                insecure_http: Some(false),
                ..Default::default()
            },
        )
        .await;
        assert!(app.runner_urls["hvn05"].starts_with("https://"));

        // 3. The agent asks; Alice approves with the passkey in the browser.
        let client = app.mcp_client().await;
        let call = call_in_background(&client, TOOL, restart_args("consul wedged on hvn05"));
        std::fs::write(&go, b"go").unwrap();
        let approved = driver
            .expect_json("{\"approved\": ID, \"state\": \"executed\"}")
            .await;
        assert_eq!(approved["state"], "executed", "{}", driver.transcript());
        let status = driver.wait_exit().await;
        assert!(status.success(), "{status}\n{}", driver.transcript());
        let res = call.await.expect("the agent's call completes");
        client.cancel().await.unwrap();
        (app, approved, res, keys[0].credential_id.clone())
    };
    let (app, approved, res, credential_id) =
        match tokio::time::timeout(Duration::from_secs(150), run).await {
            Ok(out) => out,
            Err(_) => panic!(
                "the passkey browser test did not finish within 150 s\n{}",
                driver.transcript()
            ),
        };

    // The runner ran the restart once, with the passkey's signature.
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(restarts(&record), 1, "exactly one restart ran");
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
        assert_png(&shots.join(name));
    }
}
