//! witness.toml: where the witness listens, its key, its state, and the logs it witnesses
//! (by origin, with the log's verifier keys). Unknown keys are errors; `check` names every
//! problem by key.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::tlog::keys;

/// The witness's settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WitnessConfig {
    /// Address and port to listen on (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// The witness's private key (`emisar witness keygen` writes it, mode 0600). Its name is
    /// the witness's name in every cosignature.
    pub key_file: PathBuf,
    /// Where the witness keeps the latest checkpoint it cosigned for each log
    /// (`witness-state.json`). Losing it lets the witness be made to cosign a fork: back it up.
    pub state_dir: PathBuf,
    /// PEM certificate (chain) to serve HTTPS with; needs `tls_key_file`.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// Serve plain HTTP (no TLS files). Every request and answer is signed, so TLS protects
    /// only privacy; still, plain HTTP must be asked for.
    #[serde(default)]
    pub insecure_http: bool,
    /// At most this many connections open per client address (IPv6 per /64).
    #[serde(default = "default_connections")]
    pub max_connections_per_address: usize,
    /// The logs this witness cosigns, one `[[log]]` table each.
    #[serde(default, rename = "log")]
    pub logs: Vec<LogConfig>,
}

fn default_connections() -> usize {
    64
}

/// One witnessed log.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// The log's origin: the first line of its checkpoints (e.g. `audit.example.com/emisar`).
    pub origin: String,
    /// The log's verifier keys (`name+hex(id)+base64(0x01 ‖ Ed25519 key)`); a checkpoint
    /// needs a valid signature by one of them. Several while a key is rotated.
    pub keys: Vec<String>,
}

impl WitnessConfig {
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let config: WitnessConfig = crate::util::config::read_toml(path)?;
        config
            .check()
            .map_err(|problems| anyhow::anyhow!("{}: {}", path.display(), problems.join("; ")))?;
        Ok(config)
    }

    /// Every problem, each naming its key and the rule.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        if self.listen.parse::<SocketAddr>().is_err() {
            problems.push(format!(
                "listen: `{}` is not an address and port such as 127.0.0.1:7380",
                self.listen.escape_debug()
            ));
        }
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) | (None, Some(_)) => {
                problems.push("tls_cert_file and tls_key_file: give both or neither".to_owned())
            }
            (None, None) if !self.insecure_http => problems.push(
                "tls_cert_file: the witness serves HTTPS; give tls_cert_file and tls_key_file, \
                 or set insecure_http = true for plain HTTP"
                    .to_owned(),
            ),
            (Some(_), Some(_)) if self.insecure_http => {
                problems.push("insecure_http: true, but TLS files are given; choose one".to_owned())
            }
            _ => {}
        }
        if self.max_connections_per_address == 0 {
            problems.push("max_connections_per_address: must be at least 1".to_owned());
        }
        if self.logs.is_empty() {
            problems.push("log: name at least one log to witness ([[log]] origin, keys)".into());
        }
        let mut seen = BTreeSet::new();
        for (i, log) in self.logs.iter().enumerate() {
            let at = format!("log[{i}]");
            if let Err(rule) = check_origin(&log.origin) {
                problems.push(format!("{at}.origin: {rule}"));
            } else if !seen.insert(log.origin.as_str()) {
                problems.push(format!("{at}.origin: `{}` is listed twice", log.origin));
            }
            if log.keys.is_empty() {
                problems.push(format!(
                    "{at}.keys: give at least one verifier key of the log"
                ));
            }
            for (k, key) in log.keys.iter().enumerate() {
                match keys::verifier(key) {
                    Err(e) => problems.push(format!("{at}.keys[{k}]: {e}")),
                    Ok(_) if !key_is_ed25519(key) => problems.push(format!(
                        "{at}.keys[{k}]: a log signs its checkpoints with an Ed25519 key (type 0x01)"
                    )),
                    Ok(_) => {}
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

fn key_is_ed25519(text: &str) -> bool {
    use base64::Engine;
    // name+id+key: the name and the ID hold no `+`, the base64 key may.
    text.splitn(3, '+')
        .nth(2)
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .is_some_and(|k| k.first() == Some(&keys::ED25519))
}

/// A checkpoint origin: 1 to 256 bytes of printable text without leading or trailing space
/// (tlog-checkpoint: a schema-less URL is recommended).
pub fn check_origin(origin: &str) -> Result<(), &'static str> {
    if origin.is_empty() || origin.len() > 256 {
        return Err("an origin is 1 to 256 bytes");
    }
    if origin.chars().any(char::is_control) || origin.trim() != origin {
        return Err("an origin has no control characters and no leading or trailing space");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tlog::keys::NoteKey;

    fn parse(text: &str) -> WitnessConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_good_config_passes() {
        let log = NoteKey::from_seed("log.example/a", [1; 32]).unwrap();
        let c = parse(&format!(
            "listen = \"127.0.0.1:0\"\nkey_file = \"w.key\"\nstate_dir = \"st\"\ninsecure_http = true\n\
             [[log]]\norigin = \"log.example/a\"\nkeys = [\"{}\"]\n",
            log.verifier_key()
        ));
        c.check().unwrap();
    }

    #[test]
    fn every_problem_is_named_by_key() {
        let witness = NoteKey::from_seed("w.example/w", [1; 32]).unwrap();
        let c = parse(&format!(
            "listen = \"nowhere\"\nkey_file = \"w.key\"\nstate_dir = \"st\"\n\
             [[log]]\norigin = \"\"\nkeys = []\n\
             [[log]]\norigin = \"a\"\nkeys = [\"bad\", \"{}\"]\n\
             [[log]]\norigin = \"a\"\nkeys = []\n",
            witness.cosigner_key()
        ));
        let problems = c.check().unwrap_err().join("\n");
        for needle in [
            "listen:",
            "tls_cert_file:",
            "log[0].origin: an origin is 1 to 256 bytes",
            "log[0].keys: give at least one",
            "log[1].keys[0]: a verifier key is",
            "log[1].keys[1]: a log signs its checkpoints with an Ed25519 key",
            "log[2].origin: `a` is listed twice",
        ] {
            assert!(
                problems.contains(needle),
                "{needle} missing from:\n{problems}"
            );
        }
        assert!(
            toml::from_str::<WitnessConfig>(
                "listen = \"x\"\nkey_file = \"k\"\nstate_dir = \"s\"\nlisten_port = 1\n"
            )
            .is_err()
        );
    }
}
