//! A runner's allowlists hold for every value, numbers included: the runner and the policy
//! compare with one function, so a value the one refuses the other refuses too.

use serde_json::json;

use crate::both_backends;
use crate::governance_rules::gateway_packs;
use crate::harness::app::Options;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::call;

async fn the_runner_refuses_a_number_outside_its_allowlist(backend: Backend) {
    let packs = gateway_packs();
    let app = spawn_app(
        backend,
        vec![
            RunnerSpec::new("node-1")
                .allow("ports", &["8080", "8443"])
                .service("vault", "http://127.0.0.1:9"),
        ],
        Options {
            packs_dir: Some(packs.path().to_owned()),
            ..Default::default()
        },
    )
    .await;
    let client = app.mcp_client().await;
    let port = |n: u16| json!({"port": n, "runners": ["node-1"], "reason": "which port?"});

    let res = call(&client, "gk.port", port(8443)).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    assert_eq!(
        res.structured_content.unwrap()["results"][0]["output"]["said"],
        "8443"
    );

    // No policy stands in the way here: what refuses 9090 is the runner itself.
    let res = call(&client, "gk.port", port(9090)).await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let s = res.structured_content.unwrap();
    let error = s["results"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("`port` = `9090` is not in this runner's allowlist `ports`"),
        "{error}"
    );

    // The same, signed as the server signs it, straight to the runner.
    let direct = app
        .signed_call(
            "node-1",
            "gk.port",
            json!({"port": 9090}),
            emisar::protocol::Mode::Execute,
            None,
        )
        .await;
    assert_eq!(direct.status, 403, "{}", direct.body);
    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(the_runner_refuses_a_number_outside_its_allowlist);
