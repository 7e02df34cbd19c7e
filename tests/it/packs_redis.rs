//! The redis pack against real redis-servers: every read over MCP through the server and a
//! runner whose `redis-cli` is mapped (runner `[programs]`) to the test's own server, and both
//! writes through the approval path (preview shown to the approver, approved over the portal's
//! HTTP API), with the change checked in Redis itself.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use emisar::server::principal::Role;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use crate::approvals::{Portal, add_user, call_in_background, finished, wait_for_pending};
use crate::both_backends;
use crate::harness::app::Options;
use crate::harness::redis::Redis;
use crate::harness::tools::only_output as output;
use crate::harness::{Backend, RunnerSpec, spawn_app};
use crate::mcp_calls::call;

fn runner(name: &str, redis: &Redis) -> RunnerSpec {
    let argv = redis.cli_argv();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    RunnerSpec::new(name).program("redis-cli", &argv)
}

fn text_of(res: &CallToolResult) -> String {
    res.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A client connection that stays open under a name, so `redis.clients` has someone to find.
fn named_connection(redis: &Redis, name: &str) -> UnixStream {
    let mut conn = UnixStream::connect(&redis.socket).unwrap();
    let command = format!(
        "*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n${}\r\n{name}\r\n",
        name.len()
    );
    conn.write_all(command.as_bytes()).unwrap();
    let mut reply = [0u8; 5];
    conn.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");
    conn
}

/// Requests a write, returns the pending request's id and what the approver sees of it.
async fn requested(
    alice: &Portal,
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &str,
    args: Value,
) -> (tokio::task::JoinHandle<CallToolResult>, String, Value) {
    let call = call_in_background(client, tool, args);
    let id = wait_for_pending(alice).await;
    let (status, request) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(status, 200, "{request}");
    assert_eq!(request["tool"], tool);
    assert_eq!(request["risk"], "high", "{request}");
    (call, id, request)
}

async fn redis_reads_and_maxmemory_write(backend: Backend) {
    let redis = Redis::start().await;
    // Every command lands in the slow log, so the test knows one entry to look for.
    redis.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "67108864"]);
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    redis.cli(&["SET", "greeting", "hello"]);
    let _watcher = named_connection(&redis, "watcher");
    let app = spawn_app(backend, vec![runner("cache-1", &redis)], Options::default()).await;
    let client = app.mcp_client().await;
    let on = |extra: Value| {
        let mut args = json!({"runners": ["cache-1"], "reason": "checking the cache"});
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        args
    };

    // The slow log first, so the SET above is among its newest entries.
    let slow = output(&call(&client, "redis.slowlog", on(json!({"count": 10}))).await);
    assert_eq!(slow["threshold_microseconds"], 0, "{slow}");
    assert_eq!(slow["max_entries_kept"], 128, "{slow}");
    let entries = slow["entries"].as_array().unwrap();
    assert!(!entries.is_empty() && entries.len() <= 10, "{slow}");
    assert!(slow["entries_now"].as_u64().unwrap() >= entries.len() as u64);
    let set = entries
        .iter()
        .find(|e| e["command"] == json!(["SET", "greeting", "hello"]))
        .unwrap_or_else(|| panic!("the SET in {slow}"));
    assert!(set["duration_microseconds"].is_u64(), "{set}");
    chrono::DateTime::parse_from_rfc3339(set["at"].as_str().unwrap()).unwrap();
    let ids: Vec<u64> = entries.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    // The count is bounded by the schema.
    let res = call(&client, "redis.slowlog", on(json!({"count": 500}))).await;
    assert_eq!(res.is_error, Some(true));
    assert!(text_of(&res).contains("`count`"), "{}", text_of(&res));

    let repl = output(&call(&client, "redis.replication_info", on(json!({}))).await);
    assert_eq!(repl["role"], "primary", "{repl}");
    assert_eq!(repl["connected_replicas"], 0);
    assert_eq!(repl["replicas"], json!([]));
    assert_eq!(repl["failover_state"], "no-failover");
    let info = redis.cli(&["INFO", "replication"]);
    assert!(
        info.contains(&format!(
            "master_replid:{}",
            repl["replication_id"].as_str().unwrap()
        )),
        "{repl}"
    );

    let mem = output(&call(&client, "redis.memory_info", on(json!({}))).await);
    assert_eq!(mem["maxmemory_bytes"], 67_108_864, "{mem}");
    assert_eq!(mem["maxmemory_policy"], "allkeys-lru");
    let used = mem["used_memory_bytes"].as_u64().unwrap();
    assert!(used > 0, "{mem}");
    let percent = mem["used_percent_of_maxmemory"].as_f64().unwrap();
    let expected = used as f64 * 100.0 / 67_108_864.0;
    assert!((percent - expected).abs() < 0.5, "{mem}");
    assert!(mem["evicted_keys"].is_u64() && mem["fragmentation_ratio"].is_number());

    let clients = output(&call(&client, "redis.clients", on(json!({}))).await);
    let watcher = clients["clients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "watcher")
        .unwrap_or_else(|| panic!("the watcher in {clients}"));
    assert_eq!(watcher["last_command"], "client|setname", "{watcher}");
    assert_eq!(watcher["user"], "default");
    assert!(
        clients["connected_clients"].as_u64().unwrap() >= 2,
        "{clients}"
    );
    assert_eq!(clients["maxclients"], 10000);
    let socket = redis.socket.display().to_string();
    assert!(
        clients["per_address"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["address"] == socket.as_str() && a["clients"].as_u64().unwrap() >= 2),
        "{clients}"
    );

    // The write: the approver sees current → new before anything changes.
    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let (call_handle, id, request) = requested(
        &alice,
        &client,
        "redis.config_set_maxmemory",
        on(json!({"bytes": 134_217_728})),
    )
    .await;
    let preview = &request["preview"]["cache-1"]["output"];
    assert_eq!(
        preview["maxmemory_bytes"],
        json!({"from": 67_108_864, "to": 134_217_728}),
        "{request}"
    );
    assert_eq!(preview["maxmemory"], "64.0 MiB → 128.0 MiB", "{preview}");
    assert_eq!(preview["maxmemory_policy"], "allkeys-lru");
    assert_eq!(preview["below_used_memory"], false);
    assert_eq!(preview["runtime_only"], true);
    assert_eq!(
        redis.config("maxmemory"),
        "67108864",
        "nothing before approval"
    );
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call_handle).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(
        out["results"][0]["output"]["maxmemory_bytes"],
        json!({"from": 67_108_864, "to": 134_217_728}),
        "{out}"
    );
    assert_eq!(redis.config("maxmemory"), "134217728");

    // The limit moves while the request waits: nothing is set, and everyone reads why.
    let (call_handle, id, _) = requested(
        &alice,
        &client,
        "redis.config_set_maxmemory",
        on(json!({"bytes": 268_435_456})),
    )
    .await;
    redis.cli(&["CONFIG", "SET", "maxmemory", "100663296"]);
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call_handle).await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    let (_, done) = alice.get(&format!("/api/approvals/{id}")).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(
        done["outcome_note"]
            .as_str()
            .unwrap()
            .contains("maxmemory changed since the preview (134217728 → 100663296 bytes)"),
        "{done}"
    );
    assert_eq!(redis.config("maxmemory"), "100663296", "nothing was set");

    // Asking for the value already in force is refused by the preview: nobody is asked.
    let res = call(
        &client,
        "redis.config_set_maxmemory",
        on(json!({"bytes": 100_663_296})),
    )
    .await;
    assert_eq!(res.is_error, Some(true), "{res:?}");
    assert!(
        text_of(&res).contains("maxmemory is already 100663296"),
        "{}",
        text_of(&res)
    );
    let (_, pending) = alice.get("/api/approvals?state=pending").await;
    assert_eq!(pending["approvals"], json!([]), "{pending}");

    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(redis_reads_and_maxmemory_write);

async fn redis_replica_failover_swaps_roles(backend: Backend) {
    let primary = Redis::start_tcp(&[]).await;
    let replica = Redis::replica_of(&primary).await;
    let replica_port = replica.port.unwrap();
    primary.cli(&["SET", "order:42", "paid"]);
    let app = spawn_app(
        backend,
        vec![runner("cache-1", &primary), runner("cache-2", &replica)],
        Options::default(),
    )
    .await;
    let client = app.mcp_client().await;
    let on = |runner: &str, extra: Value| {
        let mut args = json!({"runners": [runner], "reason": "moving the primary off cache-1"});
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        args
    };

    // Each side as replication_info reports it.
    let p = output(&call(&client, "redis.replication_info", on("cache-1", json!({}))).await);
    assert_eq!(p["role"], "primary", "{p}");
    assert_eq!(p["connected_replicas"], 1);
    assert_eq!(p["replicas"][0]["ip"], "127.0.0.1");
    assert_eq!(p["replicas"][0]["port"], replica_port);
    assert_eq!(p["replicas"][0]["state"], "online");
    let r = output(&call(&client, "redis.replication_info", on("cache-2", json!({}))).await);
    assert_eq!(r["role"], "replica", "{r}");
    assert_eq!(r["primary"]["port"], primary.port.unwrap());
    assert_eq!(r["primary"]["link_status"], "up");

    let target = json!({"host": "127.0.0.1", "port": replica_port});
    // Sent to the replica, the preview refuses before anyone is asked.
    let res = call(
        &client,
        "redis.replica_failover",
        on("cache-2", target.clone()),
    )
    .await;
    assert_eq!(res.is_error, Some(true));
    assert!(
        text_of(&res).contains("this node is not a primary"),
        "{}",
        text_of(&res)
    );
    // A replica this primary does not have: refused the same way.
    let res = call(
        &client,
        "redis.replica_failover",
        on("cache-1", json!({"host": "127.0.0.1", "port": 1})),
    )
    .await;
    assert!(
        text_of(&res).contains("127.0.0.1:1 is not an online replica of this node"),
        "{}",
        text_of(&res)
    );

    let password = add_user(&app, "alice", Role::Approver).await;
    let alice = Portal::login(&app, "alice", &password).await;
    let (call_handle, id, request) = requested(
        &alice,
        &client,
        "redis.replica_failover",
        on("cache-1", target),
    )
    .await;
    let preview = &request["preview"]["cache-1"]["output"];
    assert_eq!(preview["this_node"]["role"], "primary", "{request}");
    assert_eq!(preview["new_primary"]["port"], replica_port, "{preview}");
    assert_eq!(preview["new_primary"]["state"], "online");
    assert_eq!(
        preview["change"],
        format!(
            "primary → replica of 127.0.0.1:{replica_port}; 127.0.0.1:{replica_port} replica → primary"
        )
    );
    assert_eq!(primary.role(), "master", "nothing before approval");
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call_handle).await;
    assert_eq!(res.is_error, Some(false), "{res:?}");
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(out["results"][0]["output"]["failover_started"], true);

    // FAILOVER finishes in the background: the roles swap, and the data came along.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(primary.role() == "slave" && replica.role() == "master") {
        assert!(
            Instant::now() < deadline,
            "roles did not swap within 30 s: {} / {}",
            primary.cli(&["INFO", "replication"]),
            replica.cli(&["INFO", "replication"])
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(replica.cli(&["GET", "order:42"]), "paid");
    let r = output(&call(&client, "redis.replication_info", on("cache-2", json!({}))).await);
    assert_eq!(r["role"], "primary", "{r}");

    app.assert_chain_intact().await;
    client.cancel().await.unwrap();
}
both_backends!(redis_replica_failover_swaps_roles);
