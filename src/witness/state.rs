//! The witness's memory: for each origin, the latest checkpoint it cosigned (size, root hash,
//! the signed note as the log sent it and its own cosignature line), in
//! `state_dir/witness-state.json`.
//!
//! *Invariant:* the file is replaced atomically (a temporary file, synced, renamed, the
//! directory synced) before any cosignature for the new state leaves the process, so a crash
//! or restart can never roll the witness back to an older tree and make it cosign a fork. A
//! state file that cannot be read stops the witness at start; it is never reset silently.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::tlog::tree::Hash;

const FILE: &str = "witness-state.json";

/// What the witness last cosigned for one log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cosigned {
    pub size: u64,
    /// The root hash, base64 (as in the checkpoint).
    #[serde(with = "base64_hash")]
    pub root: Hash,
    /// The signed checkpoint note it cosigned, as received (evidence for auditors).
    pub checkpoint: String,
    /// This witness's cosignature line over it (`— name base64\n`), as `add-checkpoint`
    /// returned it; `GET /checkpoint/<origin>` serves the checkpoint with it. Absent in a
    /// state written before it was kept: that answer is then cosigned when asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cosignature: Option<String>,
}

/// Every log's latest cosigned checkpoint, by origin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub logs: BTreeMap<String, Cosigned>,
}

mod base64_hash {
    use super::Hash;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(h: &Hash, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&h.to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Hash, D::Error> {
        let text = String::deserialize(d)?;
        Hash::parse_hash(&text).map_err(|_| serde::de::Error::custom("root: a base64 SHA-256 hash"))
    }
}

/// The state file of one witness.
#[derive(Debug, Clone)]
pub struct StateFile {
    dir: PathBuf,
}

impl StateFile {
    /// Creates `dir` (mode 0700) if missing.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("failed to create the state directory {}", dir.display()))?;
        Ok(StateFile {
            dir: dir.to_owned(),
        })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// The kept state; empty only when no file exists yet.
    pub fn load(&self) -> anyhow::Result<State> {
        let path = self.path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
            Err(e) => return Err(e).with_context(|| format!("failed to read {}", path.display())),
        };
        serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a witness state file; restore it from a backup (starting afresh would \
                 let this witness cosign a fork of every log it witnessed)",
                path.display()
            )
        })
    }

    /// Replaces the file with `state`, durably, before returning.
    pub fn save(&self, state: &State) -> anyhow::Result<()> {
        let text = serde_json::to_vec_pretty(state).expect("the state is JSON");
        crate::util::files::replace_private(&self.dir, FILE, &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tlog::tree::record_hash;

    #[test]
    fn saved_and_loaded_back_and_garbage_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = StateFile::open(&tmp.path().join("st")).unwrap();
        assert_eq!(file.load().unwrap(), State::default());
        let mut state = State::default();
        state.logs.insert(
            "log.example/a".into(),
            Cosigned {
                size: 3,
                root: record_hash(b"x"),
                checkpoint: "note".into(),
                cosignature: Some("— w AAAA\n".into()),
            },
        );
        file.save(&state).unwrap();
        assert_eq!(file.load().unwrap(), state);
        // A state written before the cosignature was kept still loads.
        std::fs::write(
            file.path(),
            format!(
                "{{\"logs\":{{\"o\":{{\"size\":1,\"root\":\"{}\",\"checkpoint\":\"n\"}}}}}}",
                record_hash(b"y")
            ),
        )
        .unwrap();
        assert_eq!(file.load().unwrap().logs["o"].cosignature, None);
        std::fs::write(file.path(), "{").unwrap();
        let e = format!("{:#}", file.load().unwrap_err());
        assert!(e.contains("restore it from a backup"), "{e}");
    }
}
