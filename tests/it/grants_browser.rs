//! Grants and break-glass windows in the portal, in a real browser (issue 47): alice and bob,
//! each in a headless Chromium context of their own with a virtual authenticator, register
//! passkeys (tests/browser/grants_e2e.mjs); the operator puts both in the approvers file,
//! whose rule lets grants run writes signed by two people; the server restarts with it and a
//! TLS runner that requires signed approvals. The agent asks for a grant: restarts of consul on
//! hvn05, twice at most.
//!
//! What people see is what they sign: a database writer (PostgreSQL's superuser) first makes
//! the stored grant live two hours, then names another grant: the page reads every line from
//! the text a signature covers, refuses each naming the line, and offers no passkey. The grant
//! as the agent asked for it: the page shows it in words, alice and bob sign it with their
//! passkeys, and the agent's restart runs under it with no new round of people, the runner
//! verifying both passkeys' signatures itself. Alice revokes it in the page.
//!
//! A break-glass window carol asked for is listed, owed a review, with the header's count;
//! its page says BREAK-GLASS and what it covers; alice closes it, and it is listed closed and
//! unreviewed; alice proposes its review with a note and signs it with her passkey, bob's page
//! refuses the proposal a database writer made bind another grant text, and, as proposed, bob
//! signs it: reviewed. Screenshots land in target/grants-e2e/.

use std::time::Duration;

use emisar::protocol::approval::grant::Grant;
use emisar::server::audit::AuditFilter;
use emisar::server::principal::Role;
use serde_json::{Value, json};

use crate::approvals::{call_in_background, finished, restarts, signed_in, systemctl_standin};
use crate::decision_browser::{TwoPeople, approvers_of_people, options_after, order};
use crate::harness::certs::self_signed;
use crate::harness::pg::PgTestDb;
use crate::harness::tools::only_output;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::portal_browser::assert_png;

const TOOL: &str = "linux.systemctl_restart";

/// The stored text of grant `id`, as a database writer sets it.
fn set_text(pg: &PgTestDb, id: &str, text: &str) {
    pg.superuser_sql(&format!(
        "UPDATE grants SET text = '{}' WHERE id = '{id}'",
        text.replace('\'', "''")
    ))
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn people_sign_and_revoke_grants_in_the_portal_and_see_the_windows_owed_a_review() {
    let bin = tempfile::tempdir().unwrap();
    let record = systemctl_standin(bin.path());
    let TwoPeople {
        work,
        steps,
        shots,
        port,
        origin,
        webauthn,
        mut first,
        mut driver,
    } = TwoPeople::start("tests/browser/grants_e2e.mjs", "grants-e2e").await;

    let run = async {
        // 1. Registered in the browser; the operator's approvers file holds both passkeys,
        // and its rule lets a grant two people signed run any write.
        let approvers = approvers_of_people(
            &mut driver,
            &first,
            work.path(),
            &origin,
            "[[rule]]\ntools = \"*\"\napprovals = 2\ngrants = true\nbreak_glass = true\n",
        )
        .await;
        let state = work.path().join("runner-state");
        std::fs::create_dir_all(&state).unwrap();
        let cert = self_signed(work.path(), "hvn05");
        first.stop().await;
        let app = spawn_app(
            Backend::Postgres,
            vec![
                RunnerSpec::new("hvn05")
                    .path_first(bin.path())
                    .allow("systemd_units", &["consul", "nomad"])
                    .https(cert.clone(), Some(cert.fingerprint.to_string()))
                    .require_signed(&[TOOL], approvers.clone(), state),
            ],
            options_after(&first, port, &webauthn, approvers),
        )
        .await;
        let pg = first
            .pg
            .as_ref()
            .expect("the database the first server made");
        let carol = signed_in(&app, "carol", Role::Approver).await;

        // 2. The agent asks for a grant.
        let agent = app.mcp_client().await;
        let res = finished(call_in_background(
            &agent,
            "emisar.request_grant",
            json!({
                "tools": [TOOL], "runners": {"names": ["hvn05"]},
                "args": {"unit": {"in": ["consul"]}}, "calls": 2, "expires_in_secs": 900,
                "reason": "INC-42: consul flaps on hvn05",
            }),
        ))
        .await;
        assert_ne!(res.is_error, Some(true), "{res:?}");
        let asked = only_output(&res);
        let id = asked["grant_id"].as_str().unwrap().to_owned();
        let text = asked["text"].as_str().unwrap().to_owned();
        let grant = Grant::parse(&text).unwrap();

        // 3. A database writer edits the stored grant: the page refuses each edit, naming
        // the line, and offers no passkey; nobody's signature counts.
        let long = Grant {
            expires_at: (chrono::Utc::now() + chrono::Duration::hours(2))
                .format("%Y-%m-%dT%H:%M:%SZ")
                .to_string(),
            ..grant.clone()
        };
        let other = Grant {
            id: uuid::Uuid::now_v7().to_string(),
            ..grant.clone()
        };
        let edits = [
            (long.text().unwrap(), "`expires`: the grant lives"),
            (
                other.text().unwrap(),
                &*format!("`grant`: the text is of grant {}, not {id}", other.id),
            ),
        ];
        let mut n = 0;
        for (edited, says) in &edits {
            set_text(pg, &id, edited);
            n += 1;
            order(
                &steps,
                n,
                json!({"do": "look", "who": "alice", "id": id, "try": true}),
            );
            let out = driver.expect_json("{\"step\": N, \"shown\": …}").await;
            let context = format!("{says}: {out}\n{}", driver.transcript());
            assert_eq!(
                out["sign_count"][0], out["sign_count"][1],
                "the authenticator signed nothing: {context}"
            );
            let refused = out["shown"]["refused"].as_str().unwrap_or_default();
            assert!(refused.contains(says), "{context}");
            assert_eq!(out["shown"]["sign_disabled"], true, "{context}");
            assert_eq!(
                out["shown"]["words"],
                json!({}),
                "nothing shown as signed: {context}"
            );
            let (_, now) = carol.get(&format!("/api/grants/{id}")).await;
            assert_eq!(now["signatures"], json!([]), "{context}");
        }
        set_text(pg, &id, &text);

        // 4. The grant as asked: the page shows it in words, read from its text.
        n += 1;
        order(&steps, n, json!({"do": "look", "who": "alice", "id": id}));
        let out = driver.expect_json("{\"step\": N, \"shown\": …}").await;
        let context = format!("{out}\n{}", driver.transcript());
        assert_eq!(out["listed"], true, "{context}");
        let shown = &out["shown"];
        assert_eq!(shown["refused"], Value::Null, "{context}");
        assert_eq!(shown["sign_disabled"], false, "{context}");
        assert_eq!(shown["status"], "requested", "{context}");
        assert_eq!(
            shown["sha256"],
            emisar::digest::sha256_hex(text.as_bytes()),
            "{context}"
        );
        let words = &shown["words"];
        assert_eq!(words["tools"], TOOL, "{context}");
        assert_eq!(words["runners"], "only hvn05", "{context}");
        assert_eq!(words["arguments"], "unit one of \"consul\"", "{context}");
        assert_eq!(
            words["calls"], "at most 2 in all, 2 on one runner",
            "{context}"
        );
        assert_eq!(words["needs"], "2 people's signatures", "{context}");
        assert_eq!(
            words["reason"], "INC-42: consul flaps on hvn05",
            "{context}"
        );
        assert_eq!(shown["banner"], Value::Null, "{context}");

        // 5. Alice, then bob, sign with their passkeys: active.
        for (who, status, signed) in [
            ("alice", "requested", "alice"),
            ("bob", "active", "alice, bob"),
        ] {
            n += 1;
            order(&steps, n, json!({"do": "sign", "who": who, "id": id}));
            let out = driver.expect_json("{\"step\": N, \"status\": …}").await;
            let context = format!("{who}: {out}\n{}", driver.transcript());
            assert_eq!(out["error"], Value::Null, "{context}");
            assert_eq!(out["status"], status, "{context}");
            assert_eq!(out["signed_by"], signed, "{context}");
            let counts = out["sign_count"].as_array().unwrap();
            assert_eq!(
                counts[1].as_u64(),
                counts[0].as_u64().map(|c| c + 1),
                "one signature: {context}"
            );
        }

        // 6. The agent's restart runs under the grant, no new round of people: the runner
        // verified both passkeys' signatures over the grant's text itself.
        let res = finished(call_in_background(
            &agent,
            TOOL,
            json!({"unit": "consul", "runners": ["hvn05"], "reason": "INC-42"}),
        ))
        .await;
        assert_ne!(res.is_error, Some(true), "{res:?}");
        assert_eq!(restarts(&record), 1, "one restart ran");
        let (_, pending) = carol.get("/api/approvals?state=pending").await;
        assert_eq!(
            pending["approvals"],
            json!([]),
            "nobody was asked: {pending}"
        );
        let used = app
            .events(AuditFilter {
                kind: Some("grant.used".into()),
                ..Default::default()
            })
            .await;
        assert_eq!(used.len(), 1, "{used:?}");

        // 7. Alice revokes it in the page.
        n += 1;
        order(
            &steps,
            n,
            json!({"do": "revoke", "who": "alice", "id": id, "reason": "INC-42 is over"}),
        );
        let out = driver.expect_json("{\"step\": N, \"status\": …}").await;
        let context = format!("{out}\n{}", driver.transcript());
        assert_eq!(out["error"], Value::Null, "{context}");
        assert_eq!(out["status"], "revoked", "{context}");
        let (_, now) = carol.get(&format!("/api/grants/{id}")).await;
        assert_eq!(now["status"], "revoked", "{now}");
        assert_eq!(now["revoke_reason"], "INC-42 is over", "{now}");

        // 8. Carol asks for a break-glass window: it is listed, owed a review, and counted in
        // the header; its page says BREAK-GLASS and what it covers.
        let (status, window) = carol
            .post(
                "/api/break-glass",
                json!({"runners": ["hvn05"], "agent": grant.agent, "ttl_secs": 600, "reason": "INC-43: hvn05 is down"}),
                true,
            )
            .await;
        assert_eq!(status, 200, "{window}");
        let wid = window["grant_id"].as_str().unwrap().to_owned();
        n += 1;
        order(&steps, n, json!({"do": "windows", "who": "alice"}));
        let out = driver.expect_json("{\"step\": N, \"rows\": …}").await;
        let context = format!("{out}\n{}", driver.transcript());
        assert_eq!(
            out["rows"],
            json!([{"id": wid, "state": "requested"}]),
            "{context}"
        );
        assert_eq!(out["count"], "1", "{context}");
        assert_eq!(out["summary"], "1 window not reviewed yet.", "{context}");
        n += 1;
        order(&steps, n, json!({"do": "look", "who": "bob", "id": wid}));
        let out = driver.expect_json("{\"step\": N, \"shown\": …}").await;
        let context = format!("{out}\n{}", driver.transcript());
        assert_eq!(out["shown"]["banner"], "BREAK-GLASS window", "{context}");
        assert_eq!(out["shown"]["words"]["runners"], "only hvn05", "{context}");
        assert_eq!(out["shown"]["words"]["tools"], "*", "{context}");
        assert!(
            out["shown"]["words"]["break-glass"]
                .as_str()
                .is_some_and(|s| s.contains("flagged, witnessed and announced")),
            "{context}"
        );

        // 9. Alice closes it: listed closed and still owed a review.
        n += 1;
        order(
            &steps,
            n,
            json!({"do": "revoke", "who": "alice", "id": wid, "reason": "not needed after all"}),
        );
        let out = driver.expect_json("{\"step\": N, \"status\": …}").await;
        assert_eq!(out["status"], "revoked", "{out}\n{}", driver.transcript());
        n += 1;
        order(&steps, n, json!({"do": "windows", "who": "bob"}));
        let out = driver.expect_json("{\"step\": N, \"rows\": …}").await;
        let context = format!("{out}\n{}", driver.transcript());
        assert_eq!(
            out["rows"],
            json!([{"id": wid, "state": "closed-unreviewed"}]),
            "{context}"
        );
        assert_eq!(out["count"], "1", "{context}");

        // 10. The review, in the page: alice proposes one with a note and signs it; a
        // database writer makes the proposal bind another grant text, and bob's page refuses
        // it, naming `grant`, and signs nothing; as proposed, bob signs it: reviewed.
        n += 1;
        order(
            &steps,
            n,
            json!({"do": "review", "who": "alice", "id": wid, "note": "INC-43: nothing ran; closed early", "until": "proposed"}),
        );
        let out = driver.expect_json("{\"step\": N, \"proposed\": …}").await;
        let context = format!("{out}\n{}", driver.transcript());
        assert_eq!(out["error"], Value::Null, "{context}");
        assert_eq!(
            out["proposed"], "INC-43: nothing ran; closed early",
            "{context}"
        );
        let proposed = pg
            .superuser_sql(&format!(
                "SELECT text FROM break_glass_reviews WHERE window_id = '{wid}'"
            ))
            .unwrap();
        let proposed = proposed.trim_end_matches('\n').to_owned() + "\n";
        let at = proposed.find("grant sha256:").unwrap() + "grant sha256:".len();
        let elsewhere = format!(
            "{}{}{}",
            &proposed[..at],
            "0".repeat(64),
            &proposed[at + 64..]
        );
        let set_review = |text: &str| {
            pg.superuser_sql(&format!(
                "UPDATE break_glass_reviews SET text = '{}' WHERE window_id = '{wid}'",
                text.replace('\'', "''")
            ))
            .unwrap()
        };
        set_review(&elsewhere);
        n += 1;
        order(
            &steps,
            n,
            json!({"do": "review", "who": "bob", "id": wid, "until": "done"}),
        );
        let out = driver.expect_json("{\"step\": N, \"refused\": …}").await;
        let context = format!("{out}\n{}", driver.transcript());
        assert!(
            out["refused"]
                .as_str()
                .is_some_and(|r| r.contains("`grant`: the review binds another grant text")),
            "{context}"
        );
        assert_eq!(out["sign_count"][0], out["sign_count"][1], "{context}");
        set_review(&proposed);
        n += 1;
        order(
            &steps,
            n,
            json!({"do": "review", "who": "bob", "id": wid, "until": "done"}),
        );
        let out = driver.expect_json("{\"step\": N, \"done\": …}").await;
        let context = format!("{out}\n{}", driver.transcript());
        assert_eq!(out["error"], Value::Null, "{context}");
        assert!(
            out["done"]
                .as_str()
                .is_some_and(|d| d.starts_with("Reviewed by alice, bob")),
            "{context}"
        );
        n += 1;
        order(&steps, n, json!({"do": "windows", "who": "alice"}));
        let out = driver.expect_json("{\"step\": N, \"rows\": …}").await;
        let context = format!("{out}\n{}", driver.transcript());
        assert_eq!(
            out["rows"],
            json!([{"id": wid, "state": "reviewed"}]),
            "{context}"
        );
        assert_eq!(out["count"], Value::Null, "{context}");
        assert_eq!(out["summary"], "Every window is reviewed.", "{context}");
        let reviewed = app
            .events(AuditFilter {
                kind: Some("break_glass.reviewed".into()),
                ..Default::default()
            })
            .await;
        assert_eq!(reviewed.len(), 1, "{reviewed:?}");

        order(&steps, n + 1, json!({"do": "done"}));
        let status = driver.wait_exit().await;
        assert!(status.success(), "{status}\n{}", driver.transcript());
        agent.cancel().await.unwrap();
        app
    };
    let app = match tokio::time::timeout(Duration::from_secs(240), run).await {
        Ok(app) => app,
        Err(_) => panic!(
            "the grants browser test did not finish within 240 s\n{}",
            driver.transcript()
        ),
    };
    app.verify_with_cli();
    for name in [
        "look-3.png",
        "sign-5.png",
        "revoke-6.png",
        "windows-10.png",
        "review-13.png",
    ] {
        assert_png(&shots.join(name));
    }
}
