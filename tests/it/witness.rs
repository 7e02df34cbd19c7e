//! `emisar witness` as it runs: the real binary on loopback, fed checkpoints of a growing log
//! (an in-memory Merkle tree signed with a log key) with real consistency proofs, then the
//! attacker's cases: a split view, a fork, a stale `old`, bad signatures, an unknown origin,
//! oversized and malformed input, and a restart that must not forget what was cosigned.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use emisar::tlog::checkpoint;
use emisar::tlog::cosignature;
use emisar::tlog::keys::{NoteKey, Verifiers};
use emisar::tlog::tree::{Hash, MemoryTree, consistency_proof};

use crate::harness::tools::{Proc, bound_addr};

const ORIGIN: &str = "audit.example.test/emisar";

/// A log: its tree and its signing key.
struct Log {
    tree: MemoryTree,
    key: NoteKey,
    /// What each leaf says (a fork differs from `tag` on).
    tag: &'static str,
}

impl Log {
    fn new(key: &NoteKey, tag: &'static str) -> Log {
        Log {
            tree: MemoryTree::default(),
            key: NoteKey::parse(&key.private_text()).unwrap(),
            tag,
        }
    }

    fn grow_to(&mut self, size: u64) {
        while self.tree.size() < size {
            let i = self.tree.size();
            self.tree.push(format!("{} event {i}", self.tag).as_bytes());
        }
    }

    /// The signed checkpoint of the current tree.
    fn checkpoint(&self) -> Vec<u8> {
        checkpoint::sign(ORIGIN, self.tree.size(), self.tree.root(), "", &self.key).unwrap()
    }

    fn proof(&self, old: u64) -> Vec<Hash> {
        consistency_proof(old, self.tree.size(), &self.tree).unwrap()
    }
}

fn body(old: u64, proof: &[Hash], checkpoint: &[u8]) -> Vec<u8> {
    let mut b = format!("old {old}\n").into_bytes();
    for h in proof {
        b.extend(format!("{h}\n").bytes());
    }
    b.push(b'\n');
    b.extend_from_slice(checkpoint);
    b
}

struct Witness {
    _proc: Proc,
    url: String,
    /// The verifier key `emisar witness keygen` printed.
    vkey: String,
    client: reqwest::Client,
}

struct Answer {
    status: u16,
    content_type: String,
    body: String,
}

impl Witness {
    async fn add(&self, body: Vec<u8>) -> Answer {
        let r = self
            .client
            .post(format!("{}/add-checkpoint", self.url))
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        Answer {
            status,
            content_type,
            body: r.text().await.unwrap(),
        }
    }

    /// Submits `log`'s current checkpoint with a proof from `old`; asserts a 200 whose
    /// cosignature verifies with the witness's key over exactly that checkpoint.
    async fn cosigns(&self, log: &Log, old: u64) {
        let cp = log.checkpoint();
        let a = self.add(body(old, &log.proof(old), &cp)).await;
        assert_eq!(
            a.status,
            200,
            "old {old} -> {}: {}",
            log.tree.size(),
            a.body
        );
        let merged = [cp.as_slice(), a.body.as_bytes()].concat();
        let note = signed_note::Note::from_bytes(&merged).unwrap();
        let (ok, others) = note
            .verify(&Verifiers::parse([self.vkey.as_str()]).unwrap())
            .unwrap();
        assert_eq!(
            (ok.len(), others.len()),
            (1, 1),
            "one cosignature, the log's own ignored"
        );
        let t = cosignature::timestamp(ok[0].signature()).unwrap();
        assert!(t > 1_700_000_000, "the cosignature's time is now: {t}");
    }
}

struct Setup {
    dir: tempfile::TempDir,
    config: PathBuf,
    vkey: String,
    log_key: NoteKey,
}

/// A witness key (through `emisar witness keygen`) and a witness.toml naming one log.
fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("witness.key");
    let out = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args([
            "witness",
            "keygen",
            "--name",
            "witness.example.test/w1",
            "--key",
        ])
        .arg(&key_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vkey = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .to_owned();
    let log_key = NoteKey::generate(ORIGIN).unwrap();
    let config = dir.path().join("witness.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nkey_file = \"{}\"\nstate_dir = \"{}\"\ninsecure_http = true\n\
             [[log]]\norigin = \"{ORIGIN}\"\nkeys = [\"{}\"]\n",
            key_file.display(),
            dir.path().join("state").display(),
            log_key.verifier_key()
        ),
    )
    .unwrap();
    Setup {
        dir,
        config,
        vkey,
        log_key,
    }
}

async fn start(s: &Setup, log_name: &str) -> Witness {
    let log = s.dir.path().join(log_name);
    let mut proc = Proc(
        Command::new(env!("CARGO_BIN_EXE_emisar"))
            .args(["witness", "--config"])
            .arg(&s.config)
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
        vkey: s.vkey.clone(),
        client: reqwest::Client::new(),
    }
}

fn log_text(s: &Setup, name: &str) -> String {
    std::fs::read_to_string(s.dir.path().join(name)).unwrap()
}

#[tokio::test]
async fn witness_cosigns_a_growing_log_only_from_what_it_cosigned() {
    let s = setup();
    let w = start(&s, "w.log").await;
    let mut log = Log::new(&s.log_key, "a");

    // The empty tree, then growth in uneven steps, each with its consistency proof.
    w.cosigns(&log, 0).await;
    let mut old = 0;
    for size in [1, 2, 7, 8, 13, 64, 100, 255, 256, 300] {
        log.grow_to(size);
        w.cosigns(&log, old).await;
        old = size;
    }
    // The same checkpoint again is cosigned again (a retry), with an empty proof.
    w.cosigns(&log, 300).await;

    // A client that does not know the witness's size learns it from `old 0`: 409, the size.
    log.grow_to(310);
    let a = w.add(body(0, &[], &log.checkpoint())).await;
    assert_eq!((a.status, a.body.as_str()), (409, "300\n"));
    assert_eq!(a.content_type, "text/x.tlog.size");
    w.cosigns(&log, 300).await;
}

#[tokio::test]
async fn witness_refuses_split_views_forks_and_bad_input() {
    let s = setup();
    let w = start(&s, "w.log").await;
    let mut honest = Log::new(&s.log_key, "a");
    honest.grow_to(8);
    w.cosigns(&honest, 0).await;

    // Split view: another tree of the same size, signed by the same log key.
    let mut fork = Log::new(&s.log_key, "b");
    fork.grow_to(8);
    let a = w.add(body(8, &[], &fork.checkpoint())).await;
    assert_eq!(a.status, 422, "{}", a.body);
    assert!(a.body.contains("different root"), "{}", a.body);
    assert!(log_text(&s, "w.log").contains("checkpoint refused as inconsistent"));

    // A fork that grows: a proof from the fork's own tree of 8, not the one cosigned.
    fork.grow_to(12);
    let a = w.add(body(8, &fork.proof(8), &fork.checkpoint())).await;
    assert_eq!(a.status, 422, "{}", a.body);
    assert!(a.body.contains("does not extend"), "{}", a.body);

    // The honest extension with one byte of its proof changed; and with a proof cut short.
    honest.grow_to(12);
    let mut proof = honest.proof(8);
    proof[0].0[5] ^= 0x10;
    assert_eq!(
        w.add(body(8, &proof, &honest.checkpoint())).await.status,
        422
    );
    let proof = honest.proof(8);
    let a = w
        .add(body(8, &proof[..proof.len() - 1], &honest.checkpoint()))
        .await;
    assert_eq!(a.status, 422);

    // A stale `old`, and an `old` past the checkpoint.
    let a = w.add(body(5, &honest.proof(5), &honest.checkpoint())).await;
    assert_eq!((a.status, a.body.as_str()), (409, "8\n"));
    let a = w.add(body(13, &[], &honest.checkpoint())).await;
    assert_eq!(a.status, 400, "{}", a.body);

    // Signatures: another key under the log's name; a trusted signature that does not
    // verify (the size edited after signing); no signature by a known key at all.
    let impostor = NoteKey::generate(ORIGIN).unwrap();
    let mut forged = Log::new(&impostor, "a");
    forged.grow_to(12);
    let a = w.add(body(8, &forged.proof(8), &forged.checkpoint())).await;
    assert_eq!(a.status, 403, "{}", a.body);
    let edited = String::from_utf8(honest.checkpoint())
        .unwrap()
        .replacen("\n12\n", "\n13\n", 1);
    let a = w.add(body(8, &honest.proof(8), edited.as_bytes())).await;
    assert_eq!(a.status, 403, "{}", a.body);
    assert!(a.body.contains("does not verify"), "{}", a.body);

    // An origin this witness does not witness (validly signed by its own key).
    let other = NoteKey::generate("other.example.test/log").unwrap();
    let cp =
        checkpoint::sign("other.example.test/log", 12, honest.tree.root(), "", &other).unwrap();
    assert_eq!(w.add(body(0, &[], &cp)).await.status, 404);

    // Oversized and malformed bodies.
    let big = body(8, &honest.proof(8), &[b'x'; 70 * 1024]);
    assert_eq!(w.add(big).await.status, 413);
    for bad in [
        b"old 8\n".to_vec(),
        b"old 08\n\nx\n".to_vec(),
        body(8, &vec![honest.tree.root(); 64], &honest.checkpoint()),
        body(8, &[], b"not a note\n"),
        body(8, &[], &[0xff, 0xfe, b'\n', b'\n']),
    ] {
        let a = w.add(bad).await;
        assert_eq!(a.status, 400, "{}", a.body);
    }

    // None of it moved the witness: the honest extension from 8 is still the one it takes.
    w.cosigns(&honest, 8).await;
}

#[tokio::test]
async fn witness_remembers_across_restarts() {
    let s = setup();
    let mut honest = Log::new(&s.log_key, "a");
    honest.grow_to(8);
    {
        let w = start(&s, "first.log").await;
        w.cosigns(&honest, 0).await;
        // Dropping the process kills it (SIGKILL): no chance to write anything at exit.
    }
    let w = start(&s, "second.log").await;
    let mut fork = Log::new(&s.log_key, "b");
    fork.grow_to(8);
    assert_eq!(w.add(body(8, &[], &fork.checkpoint())).await.status, 422);
    let a = w.add(body(0, &[], &fork.checkpoint())).await;
    assert_eq!((a.status, a.body.as_str()), (409, "8\n"));
    honest.grow_to(16);
    w.cosigns(&honest, 8).await;
    drop(w);
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(s.dir.path().join("state/witness-state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["logs"][ORIGIN]["size"], 16);
}

#[tokio::test]
async fn witness_key_and_config_are_checked() {
    let s = setup();
    // keygen never overwrites a key; the key file is the owner's alone.
    let key_file = s.dir.path().join("witness.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let out = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["witness", "keygen", "--name", "w2", "--key"])
        .arg(&key_file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("never overwritten"));

    // A config without TLS that does not ask for plain HTTP, with a witness key where the
    // log's key belongs, is refused at start, naming both keys.
    let bad = s.dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        format!(
            "listen = \"127.0.0.1:0\"\nkey_file = \"{}\"\nstate_dir = \"{}\"\n\
             [[log]]\norigin = \"{ORIGIN}\"\nkeys = [\"{}\"]\n",
            key_file.display(),
            s.dir.path().join("state").display(),
            s.vkey
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_emisar"))
        .args(["witness", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("tls_cert_file"), "{err}");
    assert!(err.contains("log[0].keys[0]"), "{err}");

    // A key others may read, and a state file that is not one, stop the witness at start.
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let (code, err) = run_to_end(&s.config);
    assert_ne!(code, 0);
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    std::fs::create_dir_all(s.dir.path().join("state")).unwrap();
    std::fs::write(s.dir.path().join("state/witness-state.json"), "{").unwrap();
    let (code, err) = run_to_end(&s.config);
    assert_ne!(code, 0);
    assert!(err.contains("restore it from a backup"), "{err}");
}

/// Runs `emisar witness --config CONFIG`, expected to stop at start; returns (exit code,
/// stderr). A witness still running after a generous minute is killed and fails the test.
fn run_to_end(config: &Path) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let mut child = Proc(
        Command::new(env!("CARGO_BIN_EXE_emisar"))
            .args(["witness", "--config"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the witness was expected to stop at start, and still runs: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    (
        status.code().unwrap_or(-1),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}

#[tokio::test]
async fn concurrent_requests_from_one_old_size_cosign_once() {
    let s = setup();
    let w = start(&s, "w.log").await;
    let mut honest = Log::new(&s.log_key, "a");
    honest.grow_to(8);
    w.cosigns(&honest, 0).await;
    // Ten extensions of the cosigned tree of 8, all valid, all sent at once claiming `old 8`:
    // one is cosigned, the others learn the new size. Were the check and the write not under
    // one lock, several would pass and the state could roll back to a smaller tree.
    let mut bodies = Vec::new();
    for size in 9..=18 {
        honest.grow_to(size);
        bodies.push(body(8, &honest.proof(8), &honest.checkpoint()));
    }
    let answers = futures::future::join_all(bodies.into_iter().map(|b| w.add(b))).await;
    let cosigned: Vec<&Answer> = answers.iter().filter(|a| a.status == 200).collect();
    assert_eq!(
        cosigned.len(),
        1,
        "{:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    assert!(answers.iter().all(|a| a.status == 200 || a.status == 409));
    let sizes: std::collections::BTreeSet<&str> = answers
        .iter()
        .filter(|a| a.status == 409)
        .map(|a| a.body.as_str())
        .collect();
    assert_eq!(
        sizes.len(),
        1,
        "every 409 names the one size cosigned: {sizes:?}"
    );
}
