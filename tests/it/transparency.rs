//! The audit log as a transparency log, as it runs: the Merkle tree kept with every append on
//! both backends (and folded in for an old log by `emisar migrate`), checkpoints signed with
//! the log key and cosigned by two real `emisar witness` processes, proofs through the CLI and
//! the API, and the attacker who owns the database: a rewrite of an old event with every later
//! chain hash and tree node recomputed is named from a checkpoint the auditor kept, and every
//! witness refuses the server's next checkpoint, loudly.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use emisar::server::audit::checkpoints::{self, TransparencyConfig, WitnessEntry};
use emisar::server::audit::tree;
use emisar::server::audit::{AuditFilter, NewEvent, proofs};
use emisar::tlog::keys::{NoteKey, Verifiers};
use emisar::tlog::tree::{MemoryTree, SubtreeHashes, verify_consistency, verify_inclusion};

use crate::harness::Backend;
use crate::harness::app::{Options, TestApp, spawn_app};
use crate::harness::tools::{Proc, bound_addr};

pub(crate) const ORIGIN: &str = "emisar.test/audit";

fn event(i: usize) -> NewEvent {
    NewEvent {
        actor: "system:test".into(),
        kind: "server.started".into(),
        reason: Some(format!("event {i}")),
        detail: Some(serde_json::json!({"i": i, "text": "ünïcode"})),
        ..Default::default()
    }
}

/// The events after seq `after`, oldest first, every page of them.
async fn events_after(app: &TestApp, mut after: i64) -> Vec<emisar::server::audit::Event> {
    let mut events = Vec::new();
    loop {
        let page = app
            .events(AuditFilter {
                after_seq: Some(after),
                limit: 1000,
                ..Default::default()
            })
            .await;
        let Some(last) = page.last() else {
            return events;
        };
        after = last.seq;
        events.extend(page);
    }
}

/// Every event's leaf, rebuilt in memory from the events as stored.
async fn memory_tree(app: &TestApp) -> MemoryTree {
    let mut t = MemoryTree::default();
    catch_up(app, &mut t).await;
    t
}

async fn the_tree_follows_every_append(backend: Backend) {
    let app = spawn_app(backend, vec![], Options::default()).await;
    // Batches of uneven sizes, and appends racing each other (group commit).
    let mut i = 0;
    for n in [1usize, 2, 3, 7, 1, 16, 5] {
        app.audit
            .append_all((0..n).map(|k| event(i + k)).collect())
            .await
            .unwrap();
        i += n;
    }
    let racing: Vec<_> = (0..40)
        .map(|k| {
            let audit = app.audit.clone();
            tokio::spawn(async move { audit.append(event(1000 + k)).await.unwrap() })
        })
        .collect();
    for r in racing {
        r.await.unwrap();
    }
    let rows = app.audit_rows().await as u64;
    assert_eq!(
        tree::size(&app.db).await.unwrap(),
        rows,
        "one leaf per event"
    );
    let mem = memory_tree(&app).await;
    assert_eq!(mem.size(), rows);
    for size in [1, 2, 3, 13, rows / 2, rows - 1, rows] {
        assert_eq!(
            tree::root(&app.db, size).await.unwrap(),
            emisar::tlog::tree::tree_head(size, &mem).unwrap(),
            "root of {size}"
        );
    }
    // Proofs from the stored tree verify against the roots rebuilt from the events.
    for (old, new) in [(1u64, rows), (7, 13), (rows / 2, rows), (rows - 1, rows)] {
        let proof = tree::consistency_proof(&app.db, old, new).await.unwrap();
        let old_root = emisar::tlog::tree::tree_head(old, &mem).unwrap();
        let new_root = emisar::tlog::tree::tree_head(new, &mem).unwrap();
        verify_consistency(old, new, old_root, new_root, &proof).unwrap();
        let leaf = mem
            .subtree_hashes(&[emisar::tlog::tree::Subtree {
                level: 0,
                index: old - 1,
            }])
            .unwrap()[0];
        let path = tree::inclusion_proof(&app.db, new, old - 1).await.unwrap();
        verify_inclusion(leaf, old - 1, new, &path, new_root).unwrap();
    }
    // The tree is append-only like the events.
    let refused = emisar::with_pool!(&app.db, pool => sqlx::query(
        "UPDATE audit_tree SET hash = hash WHERE level = 0 AND idx = 0").execute(pool).await.map(|_| ()));
    let refused = refused.expect_err("an UPDATE of audit_tree is refused");
    assert!(refused.to_string().contains("append-only"), "{refused}");

    // An old log: the tree lost (as before the migration); `emisar migrate` folds it in again.
    let root = tree::root(&app.db, rows).await.unwrap();
    match backend {
        Backend::Postgres => {
            app.pg
                .as_ref()
                .unwrap()
                .superuser_sql(
                    "ALTER TABLE audit_tree DISABLE TRIGGER USER; DELETE FROM audit_tree; \
                     ALTER TABLE audit_tree ENABLE TRIGGER USER;",
                )
                .unwrap();
        }
        Backend::Sqlite => {
            emisar::with_pool!(&app.db, pool => {
                sqlx::query("DROP TRIGGER audit_tree_no_delete").execute(pool).await.unwrap();
                sqlx::query("DELETE FROM audit_tree").execute(pool).await.unwrap();
            });
        }
    }
    assert_eq!(tree::size(&app.db).await.unwrap(), 0);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["migrate", "--database", &app.database_url])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("audit tree: {rows} events")),
        "{stdout}"
    );
    assert_eq!(tree::root(&app.db, rows).await.unwrap(), root);
    // And the next append continues the folded tree.
    app.audit.append(event(5000)).await.unwrap();
    assert_eq!(tree::size(&app.db).await.unwrap(), rows + 1);
    assert_eq!(
        tree::root(&app.db, rows + 1).await.unwrap(),
        memory_tree(&app).await.root()
    );
}
crate::both_backends!(the_tree_follows_every_append);

/// The leaves of the events after the ones `mem` holds, added to it.
async fn catch_up(app: &TestApp, mem: &mut MemoryTree) {
    for e in events_after(app, mem.size() as i64).await {
        assert_eq!(
            mem.push_hash(emisar::protocol::witnessed::event_leaf(&e.hash).unwrap()) + 1,
            e.seq as u64,
            "one leaf per event, in seq order"
        );
    }
}

/// Random batches appended one after another, and after each, proofs between random sizes of
/// the tree as it then stands: every root, consistency proof and inclusion proof the stored
/// tree gives verifies against the tree rebuilt in memory from the events.
async fn random_batches_prove_between_random_sizes(backend: Backend) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    use std::cell::{Cell, RefCell};
    let app = spawn_app(backend, vec![], Options::default()).await;
    let handle = tokio::runtime::Handle::current();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let cell = RefCell::new(MemoryTree::default());
    let next = Cell::new(0usize);
    // A batch's size, then (old, new, leaf) drawn as numbers folded into the tree's size.
    let strategy = (
        1usize..=40,
        prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 4),
    );
    let fail = |what: String| TestCaseError::fail(what);
    let result = tokio::task::block_in_place(|| {
        runner.run(&strategy, |(batch, draws)| {
            handle.block_on(async {
                let first = next.get();
                next.set(first + batch);
                app.audit
                    .append_all((first..first + batch).map(event).collect())
                    .await
                    .map_err(|e| fail(format!("append of {batch}: {e}")))?;
                // Out of the cell while awaiting (a case that fails leaves it empty: the next
                // rebuilds it from the events).
                let mut mem = cell.take();
                catch_up(&app, &mut mem).await;
                let size = mem.size();
                let stored = tree::size(&app.db).await.unwrap();
                if stored != size {
                    return Err(fail(format!("stored tree {stored} leaves, events {size}")));
                }
                for (a, b, c) in draws {
                    let new = 1 + b % size;
                    let old = 1 + a % new;
                    let leaf_index = c % new;
                    let new_root = emisar::tlog::tree::tree_head(new, &mem).unwrap();
                    let old_root = emisar::tlog::tree::tree_head(old, &mem).unwrap();
                    let stored_root = tree::root(&app.db, new).await.unwrap();
                    if stored_root != new_root {
                        return Err(fail(format!("root of {new} of {size} differs")));
                    }
                    let proof = tree::consistency_proof(&app.db, old, new).await.unwrap();
                    verify_consistency(old, new, old_root, new_root, &proof)
                        .map_err(|e| fail(format!("consistency {old} → {new} of {size}: {e}")))?;
                    let leaf = mem
                        .subtree_hashes(&[emisar::tlog::tree::Subtree {
                            level: 0,
                            index: leaf_index,
                        }])
                        .unwrap()[0];
                    let path = tree::inclusion_proof(&app.db, new, leaf_index)
                        .await
                        .unwrap();
                    verify_inclusion(leaf, leaf_index, new, &path, new_root).map_err(|e| {
                        fail(format!("inclusion of {leaf_index} in {new} of {size}: {e}"))
                    })?;
                }
                cell.replace(mem);
                Ok(())
            })
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
crate::both_backends!(random_batches_prove_between_random_sizes);

/// A real `emisar witness` for the log `ORIGIN`.
pub(crate) struct Witness {
    _proc: Proc,
    url: String,
    pub(crate) vkey: String,
}

pub(crate) async fn witness(dir: &Path, name: &str, log_vkey: &str) -> Witness {
    let key_file = dir.join(format!("{name}.key"));
    let out = run(&[
        "witness",
        "keygen",
        "--name",
        &format!("witness.test/{name}"),
        "--key",
        key_file.to_str().unwrap(),
    ])
    .await;
    assert!(out.0 == 0, "{}", out.1);
    let vkey = out.1.lines().last().unwrap().to_owned();
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nkey_file = \"{}\"\nstate_dir = \"{}\"\ninsecure_http = true\n\
             [[log]]\norigin = \"{ORIGIN}\"\nkeys = [\"{log_vkey}\"]\n",
            key_file.display(),
            dir.join(format!("{name}-state")).display(),
        ),
    )
    .unwrap();
    let log = dir.join(format!("{name}.log"));
    let mut proc = Proc(
        std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
            .args(["witness", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let addr = bound_addr(&mut proc, &log, "witness listening").await;
    Witness {
        _proc: proc,
        url: format!("http://{addr}"),
        vkey,
    }
}

/// `[transparency]` with `witnesses` (quorum: all of them).
pub(crate) fn transparency(
    log_key_file: std::path::PathBuf,
    witnesses: [&Witness; 2],
    interval_ms: u64,
    every: u64,
) -> TransparencyConfig {
    TransparencyConfig {
        log_key_file,
        checkpoint_interval_ms: interval_ms,
        checkpoint_every_events: every,
        witnesses: witnesses
            .iter()
            .map(|w| WitnessEntry {
                url: w.url.clone(),
                key: w.vkey.clone(),
            })
            .collect(),
        witness_quorum: Some(2),
    }
}

/// Runs `emisar` with `args` (without blocking the runtime the server runs on): exit code,
/// stdout, stderr.
async fn run(args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What `/metrics` serves to `token` (an auditor's).
async fn metrics_text(app: &TestApp, token: &str) -> String {
    app.http()
        .get(format!("{}/metrics", app.base_url()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Waits until the newest checkpoint with `cosigned` cosignatures covers `size` events.
async fn checkpointed(app: &TestApp, size: u64, cosigned: usize) -> checkpoints::Stored {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(cp) = checkpoints::latest(&app.db, cosigned).await.unwrap()
            && cp.size >= size
        {
            return cp;
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint of {size} events with {cosigned} cosignatures"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn append_checkpointed(app: &TestApp, i: usize) -> u64 {
    let e = app.audit.append(event(i)).await.unwrap();
    checkpointed(app, e.seq as u64, 2).await;
    e.seq as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_is_named_from_a_kept_checkpoint_and_every_witness_refuses_what_follows() {
    let dir = tempfile::tempdir().unwrap();
    let log_key = dir.path().join("log.key");
    let out = run(&[
        "audit",
        "log-keygen",
        "--origin",
        ORIGIN,
        "--key",
        log_key.to_str().unwrap(),
    ])
    .await;
    assert_eq!(out.0, 0, "{}", out.2);
    let log_vkey = out.1.lines().last().unwrap().to_owned();
    let w1 = witness(dir.path(), "w1", &log_vkey).await;
    let w2 = witness(dir.path(), "w2", &log_vkey).await;
    let app = spawn_app(
        Backend::Postgres,
        vec![],
        Options {
            transparency: Some(transparency(log_key.clone(), [&w1, &w2], 50, 1)),
            ..Default::default()
        },
    )
    .await;
    let db = app.database_url.clone();
    // One event at a time, each witnessed before the next: the log key signs every size.
    let mut last = 0;
    for i in 0..12 {
        last = append_checkpointed(&app, i).await;
    }

    // The auditor keeps the witnessed checkpoint elsewhere.
    let out = run(&[
        "audit",
        "checkpoint",
        "--cosigned-by",
        "2",
        "--database",
        &db,
    ])
    .await;
    assert_eq!(out.0, 0, "{}", out.2);
    assert!(
        out.1.starts_with(&format!("{ORIGIN}\n{last}\n")),
        "{}",
        out.1
    );
    assert_eq!(
        out.1.matches("\n— ").count(),
        3,
        "the log's signature and two cosignatures: {}",
        out.1
    );
    let kept_size = last;
    let kept = dir.path().join("kept-checkpoint.txt");
    std::fs::write(&kept, &out.1).unwrap();
    let witnesses = Verifiers::parse([w1.vkey.as_str(), w2.vkey.as_str()]).unwrap();
    let (note, _) = emisar::tlog::checkpoint::parse(out.1.as_bytes()).unwrap();
    let (verified, _) = note.verify(&witnesses).unwrap();
    assert_eq!(verified.len(), 2, "both witnesses' cosignatures verify");

    // More events; verifying from the kept checkpoint checks only what is new.
    for i in 12..20 {
        last = append_checkpointed(&app, i).await;
    }
    let kept_arg = kept.to_str().unwrap();
    let verify = [
        "audit",
        "verify",
        "--checkpoint",
        kept_arg,
        "--log-key",
        &log_vkey,
        "--database",
        &db,
    ];
    let out = run(&verify).await;
    assert_eq!(out.0, 0, "{}{}", out.1, out.2);
    assert!(
        out.1.starts_with(&format!(
            "ok: the log extends the checkpoint you kept (size {kept_size}) to the newest signed checkpoint (size {last})"
        )),
        "{}",
        out.1
    );
    assert!(out.1.contains("8 new events verified"), "{}", out.1);
    // A key that is not the log's is refused before anything is read.
    let other = emisar::tlog::keys::NoteKey::generate(ORIGIN)
        .unwrap()
        .verifier_key();
    let out = run(&[
        "audit",
        "verify",
        "--checkpoint",
        kept_arg,
        "--log-key",
        &other,
        "--database",
        &db,
    ])
    .await;
    assert_ne!(out.0, 0);
    assert!(out.2.contains("--checkpoint"), "{}", out.2);

    // An inclusion proof, from the CLI and from the API, in a witnessed checkpoint.
    let fifth = app
        .events(AuditFilter {
            after_seq: Some(4),
            limit: 1,
            ..Default::default()
        })
        .await
        .remove(0);
    let out = run(&[
        "audit",
        "prove",
        &fifth.id,
        "--cosigned-by",
        "2",
        "--log-key",
        &log_vkey,
        "--database",
        &db,
    ])
    .await;
    assert_eq!(out.0, 0, "{}{}", out.1, out.2);
    let proof: proofs::InclusionProof = serde_json::from_str(&out.1).unwrap();
    let log_keys = Verifiers::parse([log_vkey.as_str()]).unwrap();
    assert_eq!(
        proofs::check_inclusion(&proof, &log_keys).unwrap().size(),
        last
    );
    let auditor = app
        .issue_token("auditor", emisar::server::principal::Role::Auditor)
        .await;
    let api: proofs::InclusionProof = app
        .http()
        .get(format!(
            "{}/api/audit/proof?event={}",
            app.base_url(),
            fifth.id
        ))
        .bearer_auth(&auditor)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    proofs::check_inclusion(&api, &log_keys).unwrap();
    let mut forged = api.clone();
    forged.event.reason = Some("nothing happened".into());
    let e = proofs::check_inclusion(&forged, &log_keys).unwrap_err();
    assert!(e.contains("hash"), "{e}");
    let served = app
        .http()
        .get(format!(
            "{}/api/audit/checkpoint?cosigned_by=2",
            app.base_url()
        ))
        .bearer_auth(&auditor)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(served.starts_with(&format!("{ORIGIN}\n")), "{served}");

    // The attacker owns the database: event 5 is rewritten, then every later chain hash and
    // every tree node is recomputed, so the log is consistent with itself again.
    let witnessed = checkpointed(&app, app.audit_rows().await as u64, 2)
        .await
        .size;
    rewrite_event(&app, 5, Tree::Rebuilt).await;
    assert!(
        app.assert_chain_intact().await > 0,
        "the chain alone no longer shows it"
    );
    let out = run(&verify).await;
    assert_eq!(out.0, 1, "{}{}", out.1, out.2);
    assert!(
        out.1.starts_with(&format!(
            "FAILED: the log does not extend the checkpoint you kept (size {kept_size})"
        )),
        "{}",
        out.1
    );
    assert!(out.1.contains("first changed event: seq 5 "), "{}", out.1);

    // The server's next checkpoint (a tree that does not extend what the witnesses
    // cosigned) is refused by both, and the refusal is audited, counted and logged.
    let next = app.audit.append(event(99)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let refusals = loop {
        let refusals = app
            .events(AuditFilter {
                kind: Some("witness.refused".into()),
                limit: 100,
                ..Default::default()
            })
            .await;
        let named: std::collections::BTreeSet<String> = refusals
            .iter()
            .filter_map(|e| e.detail.as_ref()?["witness"].as_str().map(str::to_owned))
            .collect();
        if named.len() == 2 {
            break refusals;
        }
        assert!(
            Instant::now() < deadline,
            "both witnesses refuse: {refusals:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for r in &refusals {
        let d = r.detail.as_ref().unwrap();
        assert_eq!(d["status"], 422, "{d}");
        assert!(d["size"].as_u64().unwrap() >= next.seq as u64, "{d}");
    }
    let newest_witnessed = checkpoints::latest(&app.db, 1).await.unwrap().unwrap();
    assert_eq!(
        newest_witnessed.size, witnessed,
        "nothing after the rewrite is witnessed"
    );
    let metrics = metrics_text(&app, &auditor).await;
    assert!(
        metrics.lines().any(
            |l| l.starts_with("emisar_witness_refusals_total{") && l.contains("status=\"422\"")
        ),
        "{metrics}"
    );
}

/// A split view: a second log under the same log key (a forked database, a replica restored
/// from an edited backup), grown to the size the witness cosigned for the real one, with other
/// events. Its server submits that checkpoint; the witness refuses it (the same size, another
/// root), and the server that sent it shows the refusal: a `witness.refused` event with the
/// witness's answer and the metric. The witness still cosigns the real log as it grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_view_of_the_same_size_is_refused_and_the_refusal_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let log_key = dir.path().join("log.key");
    let log_vkey = checkpoints::log_keygen(ORIGIN, &log_key).unwrap();
    let w = witness(dir.path(), "w1", &log_vkey).await;
    let config = TransparencyConfig {
        log_key_file: log_key,
        checkpoint_interval_ms: 50,
        checkpoint_every_events: 1,
        witnesses: vec![WitnessEntry {
            url: w.url.clone(),
            key: w.vkey.clone(),
        }],
        witness_quorum: Some(1),
    };
    let honest = spawn_app(
        Backend::Postgres,
        vec![],
        Options {
            transparency: Some(config.clone()),
            ..Default::default()
        },
    )
    .await;
    for i in 0..30 {
        honest.audit.append(event(i)).await.unwrap();
    }
    let cosigned = checkpointed(&honest, honest.audit_rows().await as u64, 1).await;

    // The other log: its own database and events, grown to exactly the cosigned size.
    let other = spawn_app(Backend::Postgres, vec![], Options::default()).await;
    let mut i = 1000;
    while (other.audit_rows().await as u64) < cosigned.size {
        other.audit.append(event(i)).await.unwrap();
        i += 1;
    }
    assert_eq!(tree::size(&other.db).await.unwrap(), cosigned.size);
    assert_ne!(
        tree::root(&other.db, cosigned.size).await.unwrap(),
        tree::root(&honest.db, cosigned.size).await.unwrap()
    );
    let mut split =
        checkpoints::Checkpointer::new(other.db.clone(), other.audit.clone(), &config).unwrap();
    assert_eq!(split.tick().await.unwrap(), cosigned.size);

    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let found = other
            .events(AuditFilter {
                kind: Some("witness.refused".into()),
                ..Default::default()
            })
            .await;
        if let Some(e) = found.into_iter().next() {
            break e;
        }
        assert!(Instant::now() < deadline, "no witness.refused event");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let d = refused.detail.unwrap();
    assert_eq!(d["witness"], "witness.test/w1", "{d}");
    assert_eq!(d["status"], 422, "{d}");
    assert_eq!(d["size"], cosigned.size, "{d}");
    assert!(
        d["answer"].as_str().unwrap().contains("different root"),
        "{d}"
    );
    assert_eq!(refused.outcome.as_deref(), Some("refused"));
    let auditor = other
        .issue_token("auditor", emisar::server::principal::Role::Auditor)
        .await;
    let metrics = metrics_text(&other, &auditor).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("emisar_witness_refusals_total{")
                && l.contains("witness=\"witness.test/w1\"")
                && l.contains("status=\"422\"")),
        "{metrics}"
    );
    // Nothing of the other log was cosigned, and the real one goes on being witnessed.
    assert_eq!(
        checkpoints::latest(&other.db, 1)
            .await
            .unwrap()
            .map(|c| c.size),
        None
    );
    honest.audit.append(event(99)).await.unwrap();
    checkpointed(&honest, cosigned.size + 1, 1).await;
}

/// After the tree and the checkpoints check out, `audit verify --checkpoint` still reads what
/// came after the kept checkpoint event by event: an event edited in place (its hash left
/// alone) is named, and a rewrite with every later chain hash recomputed but the tree's nodes
/// left as they were (so every stored proof still verifies) fails on the newest root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_came_after_a_kept_checkpoint_is_read_event_by_event() {
    let dir = tempfile::tempdir().unwrap();
    let log_key = dir.path().join("log.key");
    let log_vkey = checkpoints::log_keygen(ORIGIN, &log_key).unwrap();
    let keys = Verifiers::parse([log_vkey.as_str()]).unwrap();
    let app = spawn_app(
        Backend::Postgres,
        vec![],
        Options {
            transparency: Some(TransparencyConfig {
                log_key_file: log_key,
                checkpoint_interval_ms: 50,
                checkpoint_every_events: 1,
                witnesses: vec![],
                witness_quorum: None,
            }),
            ..Default::default()
        },
    )
    .await;
    for i in 0..10 {
        app.audit.append(event(i)).await.unwrap();
    }
    let kept = checkpointed(&app, app.audit_rows().await as u64, 0).await;
    let n = kept.size as i64;
    for i in 10..20 {
        app.audit.append(event(i)).await.unwrap();
    }
    let newest = checkpointed(&app, app.audit_rows().await as u64, 0)
        .await
        .size as i64;
    let verify = || proofs::verify_from(&app.db, kept.note.as_bytes(), &keys, None, &[]);
    let report = verify().await.unwrap();
    assert_eq!(report.problem, None, "{report:?}");
    assert_eq!(report.verified as i64, newest - n, "{report:?}");

    // Edited in place, its hash left alone.
    let k = n + 5;
    let edit = |reason: &str| {
        format!(
            "ALTER TABLE audit_events DISABLE TRIGGER USER; \
             UPDATE audit_events SET reason = '{reason}' WHERE seq = {k}; \
             ALTER TABLE audit_events ENABLE TRIGGER USER;"
        )
    };
    let original = events_after(&app, k - 1).await.remove(0);
    assert_eq!(original.seq, k);
    let pg = app.pg.as_ref().unwrap();
    pg.superuser_sql(&edit("nothing happened")).unwrap();
    let report = verify().await.unwrap();
    assert_eq!(report.first_changed, Some((k, k)), "{report:?}");
    let problem = report.problem.unwrap_or_default();
    assert!(
        problem.starts_with(&format!("event seq {k}: stored hash")),
        "{problem}"
    );
    // Put back, it verifies again.
    pg.superuser_sql(&edit(original.reason.as_deref().unwrap()))
        .unwrap();
    let report = verify().await.unwrap();
    assert_eq!(report.problem, None, "{report:?}");

    // Rewritten with every later chain hash recomputed, the tree's nodes left as they were.
    rewrite_event(&app, n + 3, Tree::LeftAsItWas).await;
    assert!(
        emisar::server::audit::verify(&app.db, None)
            .await
            .unwrap()
            .is_intact(),
        "the chain alone shows nothing"
    );
    let report = verify().await.unwrap();
    assert_eq!(report.first_changed, Some((n + 1, newest)), "{report:?}");
    assert_eq!(
        report.problem.as_deref(),
        Some(
            format!(
                "events {} to {newest} do not hash to the newest checkpoint's root",
                n + 1
            )
            .as_str()
        )
    );
}

/// What an attacker with the database does: rewrites event `seq`'s reason, then recomputes
/// every later chain hash and rebuilds every tree node from the rewritten events, with the
/// append-only triggers off.
/// What the attacker does with the tree's nodes after rewriting the events.
#[derive(PartialEq)]
enum Tree {
    Rebuilt,
    LeftAsItWas,
}

async fn rewrite_event(app: &TestApp, seq: i64, tree_nodes: Tree) {
    let events = events_after(app, 0).await;
    let mut sql = String::from(
        "ALTER TABLE audit_events DISABLE TRIGGER USER; ALTER TABLE audit_tree DISABLE TRIGGER USER; ",
    );
    let mut prev: Option<String> = None;
    let mut mem = MemoryTree::default();
    let mut nodes = Vec::new();
    for mut e in events {
        assert_eq!(e.compute_hash(), e.hash, "before the rewrite: {e:?}");
        if e.seq == seq {
            e.reason = Some("nothing happened".into());
        }
        if let Some(p) = &prev {
            e.prev_hash = p.clone();
        }
        if e.seq >= seq {
            e.hash = e.compute_hash();
            if e.seq == seq {
                sql.push_str(&format!(
                    "UPDATE audit_events SET reason = 'nothing happened' WHERE seq = {seq};"
                ));
            }
            sql.push_str(&format!(
                "UPDATE audit_events SET prev_hash = '{}', hash = '{}' WHERE seq = {};",
                e.prev_hash, e.hash, e.seq
            ));
        }
        let size = mem.size();
        let leaf = emisar::protocol::witnessed::event_leaf(&e.hash).unwrap();
        nodes.extend(emisar::tlog::tree::append(size, leaf, &mem).unwrap());
        mem.push_hash(leaf);
        prev = Some(e.hash.clone());
    }
    if tree_nodes == Tree::LeftAsItWas {
        nodes.clear();
    } else {
        sql.push_str("DELETE FROM audit_tree;");
    }
    for (n, h) in nodes {
        sql.push_str(&format!(
            "INSERT INTO audit_tree (level, idx, hash) VALUES ({}, {}, '\\x{}');",
            n.level,
            n.index,
            hex::encode(h.0)
        ));
    }
    sql.push_str(
        "ALTER TABLE audit_events ENABLE TRIGGER USER; ALTER TABLE audit_tree ENABLE TRIGGER USER;",
    );
    app.pg.as_ref().unwrap().superuser_sql(&sql).unwrap();
}

/// The server's witnesses and a log key, for a runner that requires witnessed approvals.
struct WitnessedLab {
    _dir: tempfile::TempDir,
    _bin: tempfile::TempDir,
    record: std::path::PathBuf,
    app: TestApp,
    _w1: Witness,
    _w2: Witness,
}

async fn witnessed_lab() -> WitnessedLab {
    let dir = tempfile::tempdir().unwrap();
    let log_key = dir.path().join("log.key");
    let key = emisar::tlog::keys::NoteKey::generate(ORIGIN).unwrap();
    emisar::util::files::create_private(&log_key, key.private_text().as_bytes()).unwrap();
    let w1 = witness(dir.path(), "w1", &key.verifier_key()).await;
    let w2 = witness(dir.path(), "w2", &key.verifier_key()).await;
    let bin = tempfile::tempdir().unwrap();
    let record = crate::approvals::systemctl_standin(bin.path());
    let runner = crate::harness::RunnerSpec::new("hvn05")
        .path_first(bin.path())
        .allow("systemd_units", &["consul", "nomad"])
        .require_witnessed(
            &key.verifier_key(),
            &[w1.vkey.clone(), w2.vkey.clone()],
            None,
        );
    let app = spawn_app(
        Backend::Postgres,
        vec![runner],
        Options {
            transparency: Some(transparency(log_key, [&w1, &w2], 200, 1000)),
            ..Default::default()
        },
    )
    .await;
    WitnessedLab {
        _dir: dir,
        _bin: bin,
        record,
        app,
        _w1: w1,
        _w2: w2,
    }
}

/// What a server holding server.key (and the log key) sends a runner on its own.
async fn execute_with(
    app: &TestApp,
    approval_id: &str,
    witnessed: Option<emisar::protocol::witnessed::WitnessedApproval>,
) -> (u16, String) {
    let request = emisar::protocol::CallRequest {
        tool: "linux.systemctl_restart".into(),
        args: serde_json::json!({"unit": "consul"})
            .as_object()
            .unwrap()
            .clone(),
        mode: emisar::protocol::Mode::Execute,
        preview: None,
        preview_seal: None,
        raw: false,
        approval: None,
        witnessed,
        secret_salt: None,
        wave: None,
        decision: None,
        grant: None,
    };
    let answer = app
        .signed_request(
            "hvn05",
            &request,
            &crate::harness::app::Signed {
                call_id: uuid::Uuid::new_v4().to_string(),
                approval_id: Some(approval_id.to_owned()),
                lowered_by_policy: None,
            },
        )
        .await;
    (
        answer.status,
        answer.body["error"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_requires_witnessed_approvals_runs_only_what_the_quorum_cosigned() {
    use crate::approvals::{call_in_background, finished, restarts, signed_in, wait_for_pending};
    let lab = witnessed_lab().await;
    let app = &lab.app;

    // The governed path: the approval is witnessed by both before the runner runs it.
    let client = app.mcp_client().await;
    let call = call_in_background(
        &client,
        "linux.systemctl_restart",
        serde_json::json!({"runners": ["hvn05"], "unit": "consul", "reason": "witnessed restart"}),
    );
    let alice = signed_in(app, "alice", emisar::server::principal::Role::Approver).await;
    let id = wait_for_pending(&alice).await;
    let (status, body) = alice.approve(&id).await;
    assert_eq!(status, 200, "{body}");
    let res = finished(call).await;
    let out = res.structured_content.unwrap();
    assert_eq!(out["approval"]["state"], "executed", "{out}");
    assert_eq!(restarts(&lab.record), 1, "it ran once");
    let approved = app
        .events(AuditFilter {
            approval_id: Some(id.clone()),
            kind: Some("approval.approved".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .remove(0);
    let executing = app
        .events(AuditFilter {
            approval_id: Some(id.clone()),
            kind: Some("approval.executing".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .remove(0);
    let witnessed = checkpoints::latest(&app.db, 2).await.unwrap().unwrap();
    assert!(
        witnessed.size >= approved.seq as u64,
        "the approval is witnessed"
    );
    assert!(executing.seq > approved.seq);

    // A real witnessed proof of that approval, as the server built it.
    let good = proofs::prove(&app.db, &approved.id, 2).await.unwrap();
    let good = emisar::protocol::witnessed::WitnessedApproval {
        event: good.event,
        checkpoint: good.checkpoint,
        proof: good.proof,
    };
    // Everything a compromised server can send is refused, and nothing runs.
    let refused = |answer: (u16, String), why: &str| {
        assert_eq!(answer.0, 403, "{}", answer.1);
        assert!(
            answer.1.contains(why),
            "`{}` does not say `{why}`",
            answer.1
        );
    };
    let other = uuid::Uuid::new_v4().to_string();
    // No proof at all.
    refused(
        execute_with(app, &other, None).await,
        "the call carries none",
    );
    // The proof of another approval.
    refused(
        execute_with(app, &other, Some(good.clone())).await,
        "not this call's approval",
    );
    // The event's fields edited (another approval's id) under its hash.
    let mut edited = good.clone();
    edited.event.approval_id = Some(other.clone());
    refused(execute_with(app, &other, Some(edited)).await, "hash to");
    // Cosigned by one witness where the runner needs two.
    let mut one = good.clone();
    let mut lines: Vec<&str> = good.checkpoint.lines().collect();
    let last_cosignature = lines
        .iter()
        .rposition(|l| l.starts_with("— witness.test/"))
        .unwrap();
    lines.remove(last_cosignature);
    one.checkpoint = format!("{}\n", lines.join("\n"));
    refused(
        execute_with(app, &id, Some(one)).await,
        "cosigned by 1 of the witnesses",
    );
    // A wrong audit path.
    let mut wrong = good.clone();
    wrong.proof[0] = wrong.proof[1 % wrong.proof.len()].clone();
    if wrong.proof == good.proof {
        wrong.proof.push(good.proof[0].clone());
    }
    refused(
        execute_with(app, &id, Some(wrong)).await,
        "is not in the checkpoint",
    );
    // A checkpoint whose log signature is not the log key's (a stranger's tree).
    let stranger = emisar::tlog::keys::NoteKey::generate(ORIGIN).unwrap();
    let (_, cp) = emisar::tlog::checkpoint::parse(good.checkpoint.as_bytes()).unwrap();
    let mut forged = good.clone();
    forged.checkpoint = String::from_utf8(
        emisar::tlog::checkpoint::sign(ORIGIN, cp.size(), *cp.hash(), "", &stranger).unwrap(),
    )
    .unwrap();
    refused(
        execute_with(app, &id, Some(forged)).await,
        "the log's signature",
    );
    assert_eq!(restarts(&lab.record), 1, "nothing else ran");
    // The genuine proof of the approval that already ran is a replay.
    let (status, why) = execute_with(app, &id, Some(good)).await;
    assert_eq!(status, 409, "{why}");
    assert_eq!(restarts(&lab.record), 1);
}

/// A log witnessed by real `emisar witness` processes (one, or more with `more`), as the
/// auditor of issue 45 found it: a checkpoint of `kept` events cosigned by all of them kept in
/// `kept_file`, then more events (an approved write, say), all of them cosigned up to
/// `witnessed`, whose checkpoint is in `witnessed_file`.
struct Witnessed {
    dir: tempfile::TempDir,
    app: TestApp,
    w: Witness,
    /// The witnesses after `w` (w2, …), when there are more.
    more: Vec<Witness>,
    config: TransparencyConfig,
    log_vkey: String,
    kept: u64,
    kept_file: std::path::PathBuf,
    witnessed: u64,
    witnessed_file: std::path::PathBuf,
}

/// The newest cosigned checkpoint, through the CLI as an auditor keeps it, written to
/// `dir/name`: its size and the file.
async fn keep_checkpoint(
    app: &TestApp,
    dir: &Path,
    name: &str,
    cosigned: usize,
) -> (u64, std::path::PathBuf) {
    let out = run(&[
        "audit",
        "checkpoint",
        "--cosigned-by",
        &cosigned.to_string(),
        "--database",
        &app.database_url,
    ])
    .await;
    assert_eq!(out.0, 0, "{}", out.2);
    assert!(out.1.contains("\n— witness.test/w1 "), "{}", out.1);
    let size = out.1.lines().nth(1).unwrap().parse().unwrap();
    let file = dir.join(name);
    std::fs::write(&file, &out.1).unwrap();
    (size, file)
}

/// Waits until `cosigned` witnesses have cosigned every event the log holds.
async fn all_witnessed(app: &TestApp, cosigned: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = app.audit_rows().await as u64;
        let cp = checkpointed(app, rows, cosigned).await;
        if cp.size == app.audit_rows().await as u64 {
            return;
        }
        assert!(Instant::now() < deadline, "the witness never caught up");
    }
}

async fn witnessed_log() -> Witnessed {
    witnessed_log_by(1).await
}

/// [`witnessed_log`] with `count` witnesses (w1, w2, …), every checkpoint cosigned by all.
async fn witnessed_log_by(count: usize) -> Witnessed {
    let dir = tempfile::tempdir().unwrap();
    let log_key = dir.path().join("log.key");
    let log_vkey = checkpoints::log_keygen(ORIGIN, &log_key).unwrap();
    let mut more = Vec::new();
    for i in 1..=count {
        more.push(witness(dir.path(), &format!("w{i}"), &log_vkey).await);
    }
    let w = more.remove(0);
    let config = TransparencyConfig {
        log_key_file: log_key,
        checkpoint_interval_ms: 50,
        checkpoint_every_events: 1,
        witnesses: std::iter::once(&w)
            .chain(&more)
            .map(|w| WitnessEntry {
                url: w.url.clone(),
                key: w.vkey.clone(),
            })
            .collect(),
        witness_quorum: Some(count),
    };
    let app = spawn_app(
        Backend::Postgres,
        vec![],
        Options {
            transparency: Some(config.clone()),
            ..Default::default()
        },
    )
    .await;
    for i in 0..10 {
        app.audit.append(event(i)).await.unwrap();
        all_witnessed(&app, count).await;
    }
    let (kept, kept_file) = keep_checkpoint(&app, dir.path(), "kept.txt", count).await;
    // The approved write and what followed it, each event witnessed.
    for i in 10..16 {
        app.audit.append(event(i)).await.unwrap();
        all_witnessed(&app, count).await;
    }
    let (witnessed, witnessed_file) =
        keep_checkpoint(&app, dir.path(), "witnessed.txt", count).await;
    assert!(witnessed >= kept + 6, "{kept} then {witnessed}");
    Witnessed {
        dir,
        app,
        w,
        more,
        config,
        log_vkey,
        kept,
        kept_file,
        witnessed,
        witnessed_file,
    }
}

impl Witnessed {
    /// `audit verify --checkpoint FILE`, with the witness's key when `with_witness`.
    async fn verify(&self, kept: &Path, with_witness: bool) -> (i32, String, String) {
        let mut args = vec![
            "audit",
            "verify",
            "--checkpoint",
            kept.to_str().unwrap(),
            "--log-key",
            &self.log_vkey,
            "--database",
            &self.app.database_url,
        ];
        if with_witness {
            args.extend(["--witness-key", &self.w.vkey, "--witness-quorum", "1"]);
        }
        run(&args).await
    }

    /// The insider of issue 45: as a database superuser, with the append-only triggers off
    /// (`session_replication_role = replica` skips every ordinary trigger), deletes every
    /// event above `size`, the tree's nodes over them, and every later checkpoint and
    /// cosignature.
    fn truncate_to(&self, size: u64) {
        self.app
            .pg
            .as_ref()
            .unwrap()
            .superuser_sql(&format!(
                "BEGIN; SET LOCAL session_replication_role = replica; \
                 DELETE FROM audit_events WHERE seq > {size}; \
                 DELETE FROM audit_tree WHERE (idx + 1) * (1::bigint << level) > {size}; \
                 DELETE FROM audit_cosignatures WHERE size > {size}; \
                 DELETE FROM audit_checkpoints WHERE size > {size}; COMMIT;"
            ))
            .unwrap();
    }

    /// `emisar serve` on the same database with the same `[transparency]`, its log as JSON
    /// lines in the file returned.
    async fn start_replica(&self) -> (crate::harness::tools::Proc, std::path::PathBuf) {
        let d = self.dir.path();
        let config = d.join("replica.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\ninsecure_http = true\ndatabase_url = \"{}\"\n\
                 signing_key_file = \"{}\"\n[transparency]\nlog_key_file = \"{}\"\n\
                 checkpoint_interval_ms = 50\ncheckpoint_every_events = 1\nwitness_quorum = 1\n\
                 [[transparency.witnesses]]\nurl = \"{}\"\nkey = \"{}\"\n",
                self.app.database_url,
                self.app.private_key.display(),
                self.config.log_key_file.display(),
                self.w.url,
                self.w.vkey,
            ),
        )
        .unwrap();
        let log = d.join("replica.log");
        let mut proc = Proc(
            std::process::Command::new(env!("CARGO_BIN_EXE_emisar"))
                .args(["serve", "--config", config.to_str().unwrap()])
                .env_remove("DATABASE_URL")
                .env("EMISAR_LOG_FORMAT", "json")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("emisar serving MCP") {
                return (proc, log);
            }
            if let Some(status) = proc.0.try_wait().unwrap() {
                panic!("the replica exited ({status}):\n{text}");
            }
            assert!(
                Instant::now() < deadline,
                "the replica never served:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The first `witness.refused` event that `matches`, within 20 s.
    async fn refusal(&self, matches: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let found = self
                .app
                .events(AuditFilter {
                    kind: Some("witness.refused".into()),
                    limit: 1000,
                    ..Default::default()
                })
                .await
                .into_iter()
                .filter_map(|e| e.detail)
                .find(|d| matches(d));
            if let Some(d) = found {
                return d;
            }
            assert!(Instant::now() < deadline, "no such witness.refused event");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Issue 45, "a truncated log passes": the auditor kept a cosigned checkpoint; an approved
/// write was witnessed after it; then a database superuser deleted every event above the
/// kept size and every later checkpoint. The server's checkpointer raises the alarm at its
/// next round, long before the log grows back past what the witness saw, whether it knows the
/// witness's size from memory or learns it from the witness's 409 (as after a restart);
/// `audit verify --checkpoint` fails from the checkpoint kept before the write (its newest
/// checkpoint is not cosigned) and from the one kept after it (the log is shorter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_log_fails_verify_and_the_checkpointer_raises_the_alarm_at_once() {
    let t = witnessed_log().await;
    let (kept, witnessed) = (t.kept, t.witnessed);
    let out = t.verify(&t.kept_file, true).await;
    assert_eq!(out.0, 0, "{}{}", out.1, out.2);
    assert!(
        out.1.contains("; cosigned by witness.test/w1 (quorum 1)\n"),
        "{}",
        out.1
    );

    t.truncate_to(kept);

    // The running server's next round: the witness it knows to have cosigned `witnessed`
    // events is not counted, and the alarm names it, its size and the log's.
    let alarm = t
        .refusal(|d| d["witness_size"].as_u64() == Some(witnessed))
        .await;
    assert!(
        (t.app.audit_rows().await as u64) < witnessed,
        "the alarm came before the log grew back"
    );
    assert_eq!(alarm["witness"], "witness.test/w1", "{alarm}");
    let log_size = alarm["log_size"].as_u64().unwrap();
    assert!(log_size >= kept && log_size < witnessed, "{alarm}");
    assert!(
        alarm["answer"]
            .as_str()
            .unwrap()
            .contains(&format!("cosigned {witnessed} events")),
        "{alarm}"
    );
    let auditor = t
        .app
        .issue_token("auditor", emisar::server::principal::Role::Auditor)
        .await;
    let metrics = metrics_text(&t.app, &auditor).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("emisar_witness_refusals_total{")
                && l.contains("witness=\"witness.test/w1\"")
                && l.contains("status=\"truncated\"")),
        "{metrics}"
    );
    assert_eq!(
        checkpoints::latest(&t.app.db, 1)
            .await
            .unwrap()
            .unwrap()
            .size,
        kept,
        "nothing after the truncation is cosigned"
    );

    // A server that never saw the witness's size (another replica, or this one restarted: the
    // cosignatures above `kept` are gone from the database) learns it from the witness's 409
    // at its first round, and raises the same alarm, with an ERROR line.
    let (replica, log) = t.start_replica().await;
    let from_409 = t
        .refusal(|d| d["status"] == 409 && d["witness_size"].as_u64() == Some(witnessed))
        .await;
    assert!(
        from_409["log_size"].as_u64().unwrap() < witnessed,
        "{from_409}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let error = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| {
                l["level"] == "ERROR"
                    && l["fields"]["witness_size"].as_u64() == Some(witnessed)
                    && l["fields"]["status"] == "Some(409)"
            });
        if let Some(line) = found {
            break line;
        }
        assert!(
            Instant::now() < deadline,
            "no ERROR line about the truncation:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let fields = &error["fields"];
    assert!(
        fields["message"].as_str().unwrap().contains("truncated") && fields["witness"] == t.w.url,
        "{error}"
    );
    drop(replica);

    // From the checkpoint kept before the write: the log extends it, but the witness did not
    // cosign the newest checkpoint, and the server's own alarm says why.
    let deadline = Instant::now() + Duration::from_secs(20);
    while checkpoints::latest(&t.app.db, 0)
        .await
        .unwrap()
        .unwrap()
        .size
        <= kept
    {
        assert!(Instant::now() < deadline, "no checkpoint after the alarm");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = t.verify(&t.kept_file, true).await;
    assert_eq!(out.0, 1, "{}{}", out.1, out.2);
    assert!(
        out.1
            .starts_with("FAILED: the newest stored checkpoint (size ")
            && out
                .1
                .contains("is cosigned by 0 of the witnesses you trust (none), it needs 1"),
        "{}",
        out.1
    );
    assert!(
        out.1.contains(&format!(
            "witness witness.test/w1 has cosigned {witnessed} events, the log held {log_size}: truncated"
        )),
        "{}",
        out.1
    );
    // From the checkpoint kept after the write: the log is shorter than it.
    let out = t.verify(&t.witnessed_file, true).await;
    assert_eq!(out.0, 1, "{}{}", out.1, out.2);
    assert!(
        out.1.starts_with("FAILED: the log has ")
            && out.1.contains(&format!(
                " events, fewer than the {witnessed} of the kept checkpoint: truncated\n"
            )),
        "{}",
        out.1
    );
    // The same without the witness's key: the log's length alone says it.
    let out = t.verify(&t.witnessed_file, false).await;
    assert_eq!(out.0, 1, "{}{}", out.1, out.2);
    assert!(out.1.contains("truncated"), "{}", out.1);
}

/// What witness `w` answers to `GET /checkpoint/<origin>` for this log: the status and body.
async fn witness_latest(w: &Witness) -> (u16, String) {
    let r = reqwest::get(format!("{}/checkpoint/emisar.test%2Faudit", w.url))
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// FINDING F1 (issue 45), as the red team ran it: two witnesses cosigned every checkpoint up
/// to `witnessed`; the auditor kept the one of `kept` events. The insider stops the server,
/// deletes as a database superuser everything above `kept` (events, tree nodes, checkpoints,
/// cosignatures), starts a server on the same database without `[transparency]` and lets the
/// log grow again. No checkpoint is made, so the newest stored one is the kept one, cosigned
/// by both: `audit verify --witness-key … --witness-quorum 2` passes. With `--witness-url`
/// each witness is asked what it cosigned last, and verify fails naming the truncation, and
/// once the log grows past that size with other events, the fork.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_truncated_while_no_checkpointer_runs_fails_verify_against_what_the_witnesses_cosigned()
 {
    let mut t = witnessed_log_by(2).await;
    let (kept, witnessed) = (t.kept, t.witnessed);
    let (w1, w2) = (&t.w, &t.more[0]);
    let (status, latest) = witness_latest(w1).await;
    assert_eq!(status, 200, "{latest}");
    let witness_size: u64 = latest.lines().nth(1).unwrap().parse().unwrap();
    assert!(witness_size >= witnessed, "{latest}");
    assert!(latest.contains("\n— witness.test/w1 "), "{latest}");
    assert_eq!(witness_latest(w2).await.0, 200);

    let kept_file = t.kept_file.to_str().unwrap().to_owned();
    let (w1_key, w2_key, w1_url, w2_url) = (
        w1.vkey.clone(),
        w2.vkey.clone(),
        w1.url.clone(),
        w2.url.clone(),
    );
    let verify = |database: String, urls: Vec<String>| {
        let mut args = vec![
            "audit".to_owned(),
            "verify".into(),
            "--checkpoint".into(),
            kept_file.clone(),
            "--log-key".into(),
            t.log_vkey.clone(),
            "--witness-key".into(),
            w1_key.clone(),
            "--witness-key".into(),
            w2_key.clone(),
            "--witness-quorum".into(),
            "2".into(),
            "--database".into(),
            database,
        ];
        for url in urls {
            args.extend(["--witness-url".into(), url]);
        }
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run(&args).await
        }
    };
    let both = vec![w2_url.clone(), w1_url.clone()];
    let database = t.app.database_url.clone();

    // Before: each witness's latest is in the log, paired with its key by name, in any order.
    let out = verify(database.clone(), both.clone()).await;
    assert_eq!(out.0, 0, "{}{}", out.1, out.2);
    assert!(
        out.1.contains(&format!(
            "; cosigned by witness.test/w1, witness.test/w2 (quorum 2); the log holds the tree each witness asked cosigned last: witness.test/w2 size {witness_size} ("
        )) && out
            .1
            .contains(&format!(", witness.test/w1 size {witness_size} (")),
        "{}",
        out.1
    );
    // A URL whose witness's key is not given is refused, naming the option.
    let out = run(&[
        "audit",
        "verify",
        "--checkpoint",
        &kept_file,
        "--log-key",
        &t.log_vkey,
        "--witness-key",
        &w2_key,
        "--witness-url",
        &w1_url,
        "--database",
        &database,
    ])
    .await;
    assert_eq!(out.0, 2, "{}{}", out.1, out.2);
    assert!(
        out.2.contains(&format!(
            "error: --witness-url {w1_url}: its checkpoint carries no cosignature that verifies with a --witness-key (witness.test/w2)"
        )),
        "{}",
        out.2
    );

    // The insider: the server stopped, everything above the kept size deleted, a server on the
    // same database without [transparency], a few events.
    t.app.stop().await;
    t.truncate_to(kept);
    let restarted = spawn_app(
        Backend::Postgres,
        vec![],
        Options {
            database_url: Some(database.clone()),
            keys: Some((t.app.private_key.clone(), t.app.public_key.clone())),
            ..Default::default()
        },
    )
    .await;
    let mut i = 2000;
    while (restarted.audit_rows().await as u64) < witnessed - 2 {
        restarted.audit.append(event(i)).await.unwrap();
        i += 1;
    }
    let rows = restarted.audit_rows().await as u64;
    assert!(
        rows > kept && rows < witness_size,
        "{kept} {rows} {witness_size}"
    );
    assert_eq!(
        checkpoints::latest(&restarted.db, 0)
            .await
            .unwrap()
            .unwrap()
            .size,
        kept,
        "no checkpoint after the truncation"
    );

    // The finding: without asking the witnesses, the kept checkpoint is the newest, cosigned.
    let out = verify(database.clone(), vec![]).await;
    assert_eq!(out.0, 0, "{}{}", out.1, out.2);
    assert!(
        out.1.contains(&format!(
            "newest signed checkpoint (size {kept}); 0 new events verified, {} appended since (chain-checked); cosigned by witness.test/w1, witness.test/w2 (quorum 2)\n",
            rows - kept
        )),
        "{}",
        out.1
    );
    // Asking them: both cosigned more events than the log holds.
    let out = verify(database.clone(), both.clone()).await;
    assert_eq!(out.0, 1, "{}{}", out.1, out.2);
    for w in ["witness.test/w2", "witness.test/w1"] {
        let said = format!("witness {w} cosigned size {witness_size} at ");
        let rest = out
            .1
            .split(&said)
            .nth(1)
            .unwrap_or_else(|| panic!("{said}: {}", out.1));
        assert!(
            rest.split_once(", ").unwrap().1.starts_with(&format!(
                "the log holds {rows} events: events were removed (truncated)"
            )),
            "{}",
            out.1
        );
    }
    assert!(
        out.1.starts_with("FAILED: witness witness.test/w2 "),
        "{}",
        out.1
    );
    let json: serde_json::Value = {
        let out = run(&[
            "audit",
            "verify",
            "--checkpoint",
            &kept_file,
            "--log-key",
            &t.log_vkey,
            "--witness-key",
            &w1_key,
            "--witness-url",
            &w1_url,
            "--json",
            "--database",
            &database,
        ])
        .await;
        assert_eq!(out.0, 1, "{}{}", out.1, out.2);
        serde_json::from_str(&out.1).unwrap()
    };
    assert_eq!(
        json["witness_checkpoints"][0]["size"].as_u64(),
        Some(witness_size),
        "{json}"
    );
    assert_eq!(json["witness_checkpoints"][0]["witness"], "witness.test/w1");

    // Grown back past the witnesses' size with other events: a fork of what they saw.
    while (restarted.audit_rows().await as u64) < witness_size + 2 {
        restarted.audit.append(event(i)).await.unwrap();
        i += 1;
    }
    let out = verify(database.clone(), vec![]).await;
    assert_eq!(out.0, 0, "without the witnesses: {}{}", out.1, out.2);
    let out = verify(database.clone(), both).await;
    assert_eq!(out.0, 1, "{}{}", out.1, out.2);
    assert!(
        out.1.starts_with(&format!(
            "FAILED: witness witness.test/w2 cosigned size {witness_size} at "
        )) && out.1.contains(&format!(
            "but the log's first {witness_size} events hash to "
        )) && out
            .1
            .contains(": the log forked from what the witness saw (events were replaced)"),
        "{}",
        out.1
    );
}

/// FINDING F2 (issue 45): `audit verify --witness-key` holds the auditor's witnesses to the rule
/// of the server's and the runners': the log's own key, re-encoded as a cosignature/v1 key
/// (whoever holds the log key could cosign with it), and one witness's key under a second name
/// are refused, naming the option, before the log is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_refuses_the_log_key_as_a_witness_key() {
    let t = witnessed_log().await;
    let out = t.verify(&t.kept_file, true).await;
    assert_eq!(out.0, 0, "{}{}", out.1, out.2);
    let log_key =
        NoteKey::parse(&std::fs::read_to_string(&t.config.log_key_file).unwrap()).unwrap();
    let w1_key =
        NoteKey::parse(&std::fs::read_to_string(t.dir.path().join("w1.key")).unwrap()).unwrap();
    let log_as_witness = log_key.cosigner_key();
    let w1_renamed = emisar::tlog::cosignature::verifier_key("witness.test/w9", &w1_key.public());
    for (keys, refused) in [
        (
            [t.w.vkey.as_str(), log_as_witness.as_str()],
            "error: --witness-key[1]: this is the log's own key: a log cannot witness itself",
        ),
        (
            [t.w.vkey.as_str(), w1_renamed.as_str()],
            "error: --witness-key[1]: the same key as an earlier witness: each witness counts once",
        ),
    ] {
        let out = run(&[
            "audit",
            "verify",
            "--checkpoint",
            t.kept_file.to_str().unwrap(),
            "--log-key",
            &t.log_vkey,
            "--witness-key",
            keys[0],
            "--witness-key",
            keys[1],
            "--witness-quorum",
            "1",
            "--database",
            &t.app.database_url,
        ])
        .await;
        assert_eq!(out.0, 2, "{}{}", out.1, out.2);
        assert!(out.2.contains(refused), "{}", out.2);
    }
}

/// Issue 45's second act: the truncated log grows back past the size the witness cosigned,
/// with other events (a fork). The witness refuses every checkpoint of it (its tree does not
/// extend what it cosigned), so no checkpoint after the truncation is ever cosigned, and
/// `audit verify --checkpoint` with the witness's key fails from the checkpoint kept before
/// the write: the log key alone signed the fork.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_log_grown_back_with_other_events_fails_verify_on_its_cosignatures() {
    let t = witnessed_log().await;
    let (kept, witnessed) = (t.kept, t.witnessed);
    t.truncate_to(kept);
    let mut i = 1000;
    while (t.app.audit_rows().await as u64) < witnessed + 3 {
        t.app.audit.append(event(i)).await.unwrap();
        i += 1;
    }
    let grown = t.app.audit_rows().await as u64;
    // The witness refuses the fork once it reaches past its size: not consistent.
    let refused = t
        .refusal(|d| d["status"] == 422 && d["size"].as_u64() > Some(witnessed))
        .await;
    assert_eq!(refused["witness"], "witness.test/w1", "{refused}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let newest = loop {
        let newest = checkpoints::latest(&t.app.db, 0).await.unwrap().unwrap();
        if newest.size >= grown {
            break newest.size;
        }
        assert!(Instant::now() < deadline, "no checkpoint of the grown log");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        checkpoints::latest(&t.app.db, 1)
            .await
            .unwrap()
            .unwrap()
            .size,
        kept,
        "nothing of the fork is cosigned"
    );

    let out = t.verify(&t.kept_file, true).await;
    assert_eq!(out.0, 1, "{}{}", out.1, out.2);
    let size: u64 = out
        .1
        .strip_prefix("FAILED: the newest stored checkpoint (size ")
        .and_then(|rest| rest.split(')').next())
        .and_then(|size| size.parse().ok())
        .unwrap_or_else(|| panic!("{}", out.1));
    assert!(size >= newest, "{}", out.1);
    assert!(
        out.1.starts_with(&format!(
            "FAILED: the newest stored checkpoint (size {size}) is cosigned by 0 of the witnesses you trust (none), it needs 1: the witnesses did not follow the log to it"
        )),
        "{}",
        out.1
    );
    // Without the witness's key the log key's word is all there is: the fork extends the
    // kept checkpoint, and verify can only say that it did not check the cosignatures.
    let out = t.verify(&t.kept_file, false).await;
    assert_eq!(out.0, 0, "{}{}", out.1, out.2);
    assert!(
        out.1
            .ends_with("; its cosignatures not checked (no --witness-key)\n"),
        "{}",
        out.1
    );
    // From the checkpoint kept after the write, the fork does not extend it.
    let out = t.verify(&t.witnessed_file, true).await;
    assert_eq!(out.0, 1, "{}{}", out.1, out.2);
    assert!(
        out.1.starts_with(&format!(
            "FAILED: the log does not extend the checkpoint you kept (size {witnessed})"
        )),
        "{}",
        out.1
    );
}
