//! The runner's memory of the approvals it executed, kept in `state_dir` so that no restart
//! and no lost file lets one approval run twice here.
//!
//! - `approvals-executed`: one `ID KEEP_UNTIL` line per approval executed here (and one
//!   `decision:ID` per rollout decision a run here was made under, one `grant:ID#N` per call
//!   run here under a grant, the Nth of its uses here, and one `revoked:ID` per grant the
//!   server said was revoked), appended and synced *before* the write runs. A last line without its newline was torn by a crash
//!   before the sync returned, so nothing ran under it: it is dropped, with a warning. Any
//!   other malformed line stops the runner from starting (the file is not what it wrote).
//! - `state-since`: when this runner's state began (unix milliseconds). A runner whose state was
//!   lost starts a new one at its next start, so it refuses every approval requested before
//!   then (the requested time is in the approval's UUIDv7 id, covered by the signatures or the
//!   witnessed event): an approval it may have executed and forgotten never runs again.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;

use crate::protocol::signing::now;

/// Milliseconds since the epoch.
fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

const EXECUTED_FILE: &str = "approvals-executed";
const SINCE_FILE: &str = "state-since";

pub(super) struct Executed {
    dir: PathBuf,
    /// Approval ids executed here, with when they stop mattering (unix seconds).
    ids: Mutex<HashMap<String, u64>>,
    /// When this runner's state began (unix milliseconds).
    since: u64,
}

impl Executed {
    /// Reads the ledger from `dir` (dropping expired ids and a torn last line, and rewriting
    /// the file without them); a runner with no `state-since` starts its state now.
    pub(super) fn load(dir: &Path) -> anyhow::Result<Executed> {
        let t = now();
        let path = dir.join(EXECUTED_FILE);
        let mut ids = HashMap::new();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let (whole, torn) = match text.rfind('\n') {
                    Some(i) => (&text[..=i], &text[i + 1..]),
                    None => ("", text.as_str()),
                };
                if !torn.is_empty() {
                    tracing::warn!(file = %path.display(), line = %torn.escape_debug(),
                        "dropping the torn last line of the executed approvals: it was never synced, so nothing ran under it");
                }
                for line in whole.lines() {
                    let (id, until) = line
                        .split_once(' ')
                        .and_then(|(id, e)| Some((id, e.parse::<u64>().ok()?)))
                        .with_context(|| format!("{}: malformed line `{line}`", path.display()))?;
                    if until > t {
                        ids.insert(id.to_owned(), until);
                    }
                }
                let kept: String = ids.iter().map(|(id, e)| format!("{id} {e}\n")).collect();
                crate::util::files::replace_private(dir, EXECUTED_FILE, kept.as_bytes())?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
        let since_path = dir.join(SINCE_FILE);
        let since = match std::fs::read_to_string(&since_path) {
            Ok(text) => text
                .trim()
                .parse()
                .with_context(|| format!("{}: not a number", since_path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A new state, or a lost one: nothing requested before now may run here. When
                // it cannot be kept, each start is a new state (stricter, never looser).
                let since = now_millis();
                let kept = crate::util::files::create_private_dir(dir).and_then(|()| {
                    crate::util::files::replace_private(
                        dir,
                        SINCE_FILE,
                        since.to_string().as_bytes(),
                    )
                    .map_err(std::io::Error::other)
                });
                if let Err(e) = kept {
                    tracing::warn!(error = %e, dir = %dir.display(),
                        "cannot keep when this runner's state began: each start refuses the approvals requested before it");
                }
                since
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", since_path.display())),
        };
        Ok(Executed {
            dir: dir.to_owned(),
            ids: Mutex::new(ids),
            since,
        })
    }

    /// When this runner's state began: approvals requested before it are refused.
    #[cfg(test)]
    pub fn since(&self) -> u64 {
        self.since
    }

    /// Records `approval_id` as executed here, durably, before anything runs; refuses one
    /// executed before (the error says so), or any when the record cannot be made.
    pub(super) fn record(&self, approval_id: &str, keep_until: u64) -> Result<(), Refused> {
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        if ids.contains_key(approval_id) {
            return Err(Refused::Reused(
                match approval_id.strip_prefix("decision:") {
                    Some(decision) => format!(
                        "the rollout decision {decision} was already carried out on this runner: a decision is good for one execution"
                    ),
                    None => format!(
                        "approval {approval_id} was already executed on this runner: an approval is good for one execution"
                    ),
                },
            ));
        }
        self.append(&mut ids, approval_id, keep_until)
    }

    /// Takes the next of the `limit` uses grant `grant_id` has on this runner, durably, before
    /// anything runs: records `grant:ID#N` for the first N from 1 not recorded yet, and
    /// returns N; refuses when all `limit` are (the grant's calls here are spent), or when
    /// the record cannot be made. The lock is held from the count to the sync, so two calls
    /// at once never take one use.
    pub(super) fn take_use(
        &self,
        grant_id: &str,
        limit: u32,
        keep_until: u64,
    ) -> Result<u32, Refused> {
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        let key = |n: u32| format!("grant:{grant_id}#{n}");
        let Some(n) = (1..=limit).find(|n| !ids.contains_key(&key(*n))) else {
            return Err(Refused::Reused(format!(
                "grant {grant_id} allows {limit} call(s) on this runner, and {limit} ran here: its calls here are spent"
            )));
        };
        self.append(&mut ids, &key(n), keep_until)?;
        Ok(n)
    }

    /// Records that grant `grant_id` was revoked, durably, until its expiry (past it the grant
    /// runs nothing anyway); recording it twice changes nothing.
    pub(super) fn revoke(&self, grant_id: &str, expires: u64) -> Result<(), Refused> {
        let key = format!("revoked:{grant_id}");
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        if ids.contains_key(&key) {
            return Ok(());
        }
        self.append(&mut ids, &key, expires)
    }

    /// Whether grant `grant_id` was revoked here (and still matters).
    pub(super) fn revoked(&self, grant_id: &str) -> bool {
        self.contains(&format!("revoked:{grant_id}"))
    }

    /// Appends `key` with `keep_until` to the file and syncs it, then to `ids` (whose lock the
    /// caller holds), dropping the entries that no longer matter.
    fn append(
        &self,
        ids: &mut HashMap<String, u64>,
        key: &str,
        keep_until: u64,
    ) -> Result<(), Refused> {
        let t = now();
        ids.retain(|_, until| *until > t);
        let append = || -> std::io::Result<()> {
            crate::util::files::create_private_dir(&self.dir)?;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(self.dir.join(EXECUTED_FILE))?;
            f.write_all(format!("{key} {keep_until}\n").as_bytes())?;
            f.sync_data()
        };
        append().map_err(|e| {
            Refused::Forbidden(format!(
                "cannot record `{key}` in {} ({e}); nothing was run",
                self.dir.display()
            ))
        })?;
        ids.insert(key.to_owned(), keep_until);
        Ok(())
    }

    /// Whether `id` was executed here (and still matters).
    pub(super) fn contains(&self, id: &str) -> bool {
        let ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        ids.get(id).is_some_and(|until| *until > now())
    }

    /// Refuses an approval (or a grant: `what` names it, e.g. `approval ID`) requested (unix
    /// milliseconds) before this runner's state began.
    pub(super) fn check_requested(&self, what: &str, requested: u64) -> Result<(), String> {
        if requested < self.since {
            return Err(format!(
                "{what} was requested at {requested} (unix ms), before this runner's state began at {} (its state_dir is new or was lost): it may have run here already, so it never runs; ask again",
                self.since
            ));
        }
        Ok(())
    }
}

/// Why a runner refused an approved execution: a second one (409), or anything else (403).
#[derive(Debug)]
pub(super) enum Refused {
    Reused(String),
    Forbidden(String),
}

impl From<String> for Refused {
    fn from(why: String) -> Self {
        Refused::Forbidden(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state a runner makes for its ledger is its own: the directory 0700, the files 0600
    /// (a configured runner made them 0755 and 0644 before; red team 2).
    #[test]
    fn the_ledger_and_its_directory_are_the_runners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let ledger = Executed::load(&dir).unwrap();
        ledger.record("a1", now() + 60).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(EXECUTED_FILE)), 0o600);
        assert_eq!(mode(&dir.join(SINCE_FILE)), 0o600);
    }

    #[test]
    fn executed_ids_survive_a_restart_and_run_once() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Executed::load(dir.path()).unwrap();
        ledger.record("a1", now() + 60).unwrap();
        assert!(matches!(
            ledger.record("a1", now() + 60),
            Err(Refused::Reused(_))
        ));
        let again = Executed::load(dir.path()).unwrap();
        assert!(matches!(
            again.record("a1", now() + 60),
            Err(Refused::Reused(_))
        ));
        assert_eq!(again.since(), ledger.since());
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_a_malformed_one_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let until = now() + 60;
        std::fs::write(
            dir.path().join(EXECUTED_FILE),
            format!("a1 {until}\na2 {until}\na3-torn-mid-"),
        )
        .unwrap();
        let ledger = Executed::load(dir.path()).unwrap();
        assert!(matches!(
            ledger.record("a2", until),
            Err(Refused::Reused(_))
        ));
        ledger.record("a3", until).unwrap();
        let text = std::fs::read_to_string(dir.path().join(EXECUTED_FILE)).unwrap();
        assert!(text.ends_with(&format!("a3 {until}\n")), "{text}");
        std::fs::write(dir.path().join(EXECUTED_FILE), "a1 soon\n").unwrap();
        let e = Executed::load(dir.path()).err().unwrap();
        assert!(format!("{e:#}").contains("malformed line"), "{e:#}");
    }

    #[test]
    fn a_lost_state_refuses_what_was_requested_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Executed::load(dir.path()).unwrap();
        let since = ledger.since();
        ledger.check_requested("approval a1", since).unwrap();
        let e = ledger
            .check_requested("approval a1", since - 1)
            .unwrap_err();
        assert!(e.contains("state_dir is new or was lost"), "{e}");
        // The start time is kept: a restart with the state keeps it.
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(Executed::load(dir.path()).unwrap().since(), since);
        // Lost: a new state begins at the next start.
        std::fs::remove_dir_all(dir.path()).unwrap();
        assert!(Executed::load(dir.path()).unwrap().since() > since);
    }

    /// A grant's uses here are counted in the ledger: the first `limit` calls take one each,
    /// the next is refused, after a restart too; two threads at once never take one use; a
    /// revocation is kept across a restart and recorded once.
    #[test]
    fn a_grants_uses_here_are_counted_once_each_and_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = std::sync::Arc::new(Executed::load(dir.path()).unwrap());
        let keep = now() + 60;
        let took: Vec<u32> = (0..4)
            .map(|_| {
                let l = ledger.clone();
                std::thread::spawn(move || l.take_use("g1", 3, keep).ok())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|t| t.join().unwrap())
            .collect();
        let mut sorted = took.clone();
        sorted.sort();
        assert_eq!(sorted, vec![1, 2, 3], "{took:?}");
        let again = Executed::load(dir.path()).unwrap();
        let e = again.take_use("g1", 3, keep).unwrap_err();
        assert!(
            matches!(&e, Refused::Reused(why) if why.contains("spent")),
            "{e:?}"
        );
        assert_eq!(again.take_use("g2", 3, keep).unwrap(), 1);
        assert!(!again.revoked("g2"));
        again.revoke("g2", keep).unwrap();
        again.revoke("g2", keep).unwrap();
        let text = std::fs::read_to_string(dir.path().join(EXECUTED_FILE)).unwrap();
        assert_eq!(text.matches("revoked:g2 ").count(), 1, "{text}");
        assert!(Executed::load(dir.path()).unwrap().revoked("g2"));
    }
}
