//! The runner's seal on what its preview captured.
//!
//! A preview's values leave the runner in its answer, wait in the approval request on the
//! server (and in its database), and come back with the execution, where they fill the
//! write's templates. The seal lets the runner know, before it runs anything, that they are
//! exactly the values it produced for this call, this tool, this pack and these arguments:
//! whatever lies between (the network, a replica, the database, a compromised server) can
//! neither invent a value nor change one.
//!
//! The seal is an HMAC-SHA256 under a key only this runner holds. The key is made at start and
//! kept in memory for the runner's lifetime, never written to `state_dir`, so a restart
//! between a preview and its execution makes that execution refuse: the request is asked
//! again, with a fresh preview.
//!
//! Invariant: the sealed message is the canonical JSON of every field below; a value that
//! reaches the runner in any other form does not verify.

use hmac::{Hmac, Mac};
use serde_json::{Map, Value, json};
use sha2::Sha256;

use crate::digest::canonical_json;
use crate::protocol::{CallRequest, Mode};

/// This runner's sealing key.
pub(super) struct SealKey([u8; 32]);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

/// What a seal covers.
pub(super) struct Sealed<'a> {
    /// This runner: a seal never verifies on another.
    pub runner: &'a str,
    /// The call the preview ran for; its execution carries the same id.
    pub call_id: &'a str,
    pub tool: &'a str,
    pub pack_sha256: &'a str,
    /// The arguments the preview ran with; the execution must carry the same.
    pub args: &'a Map<String, Value>,
    pub vars: &'a Map<String, Value>,
}

impl Sealed<'_> {
    fn message(&self) -> String {
        // The digest of the preview call itself, rebuilt from the arguments, so the seal
        // names the request that produced the values.
        let preview_request = CallRequest {
            tool: self.tool.to_owned(),
            args: self.args.clone(),
            mode: Mode::Preview,
            preview: None,
            preview_seal: None,
            raw: false,
            approval: None,
            witnessed: None,
            secret_salt: None,
            wave: None,
            decision: None,
            grant: None,
        }
        .digest();
        canonical_json(&json!({
            "runner": self.runner,
            "call_id": self.call_id,
            "tool": self.tool,
            "pack_sha256": self.pack_sha256,
            "preview_request_sha256": preview_request,
            "vars": self.vars,
        }))
    }
}

impl SealKey {
    /// A fresh random key.
    pub(super) fn generate() -> anyhow::Result<Self> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)
            .map_err(|e| anyhow::anyhow!("failed to get random bytes for the seal key: {e}"))?;
        Ok(SealKey(key))
    }

    fn mac(&self, sealed: &Sealed<'_>) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(sealed.message().as_bytes());
        mac
    }

    /// The seal (hex) over `sealed`.
    pub(super) fn seal(&self, sealed: &Sealed<'_>) -> String {
        hex::encode(self.mac(sealed).finalize().into_bytes())
    }

    /// Whether `seal` is this key's seal over exactly `sealed` (compared in constant time).
    pub(super) fn verify(&self, sealed: &Sealed<'_>, seal: &str) -> bool {
        hex::decode(seal).is_ok_and(|bytes| self.mac(sealed).verify_slice(&bytes).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_seal_holds_only_for_what_it_sealed() {
        let key = SealKey::generate().unwrap();
        let args = map(json!({"job": "traefik", "memory": 4096}));
        let vars = map(json!({"job_modify_index": 93, "before": {"cpu": 500, "memory": 1024}}));
        let sealed = |args, vars| Sealed {
            runner: "hvn01",
            call_id: "c1",
            tool: "nomad.task_resources_set",
            pack_sha256: "p",
            args,
            vars,
        };
        let seal = key.seal(&sealed(&args, &vars));
        assert!(key.verify(&sealed(&args, &vars), &seal));
        // Key order is not content.
        let reordered =
            map(json!({"before": {"memory": 1024, "cpu": 500}, "job_modify_index": 93}));
        assert!(key.verify(&sealed(&args, &reordered), &seal));

        let mut changed = vars.clone();
        changed.insert("job_modify_index".into(), json!(94));
        let mut added = vars.clone();
        added.insert("job".into(), json!("vault"));
        let other_args = map(json!({"job": "vault", "memory": 4096}));
        for (what, s) in [
            ("a changed value", sealed(&args, &changed)),
            ("an added value", sealed(&args, &added)),
            ("other arguments", sealed(&other_args, &vars)),
            (
                "another runner",
                Sealed {
                    runner: "hvn02",
                    ..sealed(&args, &vars)
                },
            ),
            (
                "another call",
                Sealed {
                    call_id: "c2",
                    ..sealed(&args, &vars)
                },
            ),
            (
                "another pack",
                Sealed {
                    pack_sha256: "q",
                    ..sealed(&args, &vars)
                },
            ),
        ] {
            assert!(!key.verify(&s, &seal), "{what}");
        }
        assert!(!key.verify(&sealed(&args, &vars), "not hex"));
        assert!(!key.verify(&sealed(&args, &vars), ""));
        // Another runner's key (or this runner after a restart) does not verify it.
        let other = SealKey::generate().unwrap();
        assert!(!other.verify(&sealed(&args, &vars), &seal));
    }
}
