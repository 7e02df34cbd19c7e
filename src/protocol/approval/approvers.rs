//! The approvers file: the people a runner trusts to approve writes, their keys, and per tool
//! how many of them must sign. A runner reads it on its own (deployed like `authorized_keys`),
//! or takes it from the server only when an organisation root key that the runner's own config
//! names signed it.
//!
//! ```toml
//! serial = 3                      # raise it with every change: a runner refuses an older file
//!
//! [webauthn]                      # the portal the passkeys were registered with
//! rp_id = "emisar.example.com"
//! origins = ["https://emisar.example.com"]
//!
//! [[person]]
//! name = "alice"
//! ssh = ["ssh-ed25519 AAAAC3Nza… alice@laptop"]
//! passkeys = [{ id = "b64url credential id", alg = "ES256", public_key = "b64 SPKI DER" }]
//!
//! [[rule]]                        # the first rule whose pattern matches the tool decides
//! tools = "nomad.*"
//! approvals = 2
//!
//! [[rule]]
//! tools = "linux.*"
//! approvals = 2
//! ssh_signatures = 1              # at least one from the terminal (`emisar approvals approve`)
//! grants = true                   # may run under a grant signed by 2 people (default false)
//! break_glass = true              # this runner honours a break-glass window (default false)
//!
//! [[rule]]
//! tools = "*"
//! approvals = 1
//! unapproved = false              # true: a write the server's policy lowered runs unsigned
//! ```
//!
//! `ssh_signatures` is for a server that could be compromised: the portal's page, which asks
//! for a passkey, is code the server serves, so a server that owns it can show one write and
//! have a passkey sign another. An SSH signature comes from the terminal, whose check of the
//! statement the server does not serve.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};
use ssh_key::PublicKey;

use super::sshsig::{self, APPROVERS_NAMESPACE};
use super::webauthn::{CoseAlg, PasskeyPublic, RelyingParty};

/// The file as written (TOML).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApproversFile {
    /// Raised with every change; a runner that accepted serial N refuses a carried file below N.
    #[serde(default)]
    pub serial: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webauthn: Option<WebauthnSection>,
    #[serde(default, rename = "person", skip_serializing_if = "Vec::is_empty")]
    pub people: Vec<PersonEntry>,
    #[serde(default, rename = "rule", skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebauthnSection {
    pub rp_id: String,
    pub origins: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PersonEntry {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passkeys: Vec<PasskeyEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PasskeyEntry {
    /// The credential id, base64url without padding (as the browser gives it).
    pub id: String,
    pub alg: CoseAlg,
    /// SubjectPublicKeyInfo DER, standard base64.
    pub public_key: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleEntry {
    /// A glob over tool names (`*` matches any run of characters).
    pub tools: String,
    /// How many distinct people of this file must sign.
    pub approvals: u32,
    /// Whether a write the server's policy lowered below approval may run without signatures.
    #[serde(default)]
    pub unapproved: bool,
    /// How many of the signatures must be SSH signatures (made in the terminal, whose check
    /// the server does not serve), at most `approvals`. Default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ssh_signatures: u32,
    /// Whether this rule's tools may run under a grant (people's signed, time-boxed mandate
    /// for an agent's writes, signed by as many people as `approvals`). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grants: bool,
    /// Whether this rule's tools may run inside a break-glass window (a grant flagged
    /// `break_glass`, over named runners, signed by two people at least). Default false: a
    /// runner whose file never says so honours no break-glass at all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub break_glass: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A checked approvers file: every key parsed, every rule compiled.
#[derive(Debug, Clone)]
pub struct Approvers {
    pub serial: u64,
    pub rp: Option<RelyingParty>,
    pub people: Vec<Person>,
    rules: Vec<(glob::Pattern, RuleEntry)>,
    /// Hex SHA-256 of the file's bytes, as read: what runners and the server compare.
    pub sha256: String,
}

#[derive(Debug, Clone)]
pub struct Person {
    pub name: String,
    pub ssh: Vec<PublicKey>,
    pub passkeys: Vec<PasskeyPublic>,
}

/// What the file says about one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub approvals: u32,
    pub unapproved: bool,
    pub ssh_signatures: u32,
    /// Whether the tool may run under a grant.
    pub grants: bool,
    /// Whether the tool may run inside a break-glass window.
    pub break_glass: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("approvers file: {0}")]
pub struct ApproversError(pub String);

fn err(msg: impl Into<String>) -> ApproversError {
    ApproversError(msg.into())
}

impl Approvers {
    /// Reads and checks an approvers file's text.
    pub fn parse(text: &str) -> Result<Approvers, ApproversError> {
        let file: ApproversFile = toml::from_str(text).map_err(|e| err(e.message().to_owned()))?;
        Self::from_file(file, crate::digest::sha256_hex(text.as_bytes()))
    }

    fn from_file(file: ApproversFile, sha256: String) -> Result<Approvers, ApproversError> {
        let mut people = Vec::new();
        let mut seen_keys: BTreeMap<String, String> = BTreeMap::new();
        for (i, p) in file.people.iter().enumerate() {
            if !crate::util::input::is_identifier(&p.name) && !is_person_name(&p.name) {
                return Err(err(format!(
                    "`person[{i}].name` must be a user name (letters, digits, `_ . @ -`) or `person:<id>`"
                )));
            }
            if people.iter().any(|q: &Person| q.name == p.name) {
                return Err(err(format!(
                    "`person[{i}].name`: `{}` is listed twice",
                    p.name
                )));
            }
            let mut ssh = Vec::new();
            for (j, line) in p.ssh.iter().enumerate() {
                let field = format!("person[{i}].ssh[{j}]");
                let key = sshsig::read_public_key(&field, line).map_err(|e| err(e.to_string()))?;
                let id = sshsig::key_id(&key);
                if let Some(other) = seen_keys.insert(id.clone(), p.name.clone()) {
                    return Err(err(format!(
                        "`{field}`: key {id} is listed for `{other}` already: one key is one person"
                    )));
                }
                ssh.push(key);
            }
            let mut passkeys = Vec::new();
            for (j, k) in p.passkeys.iter().enumerate() {
                let field = format!("person[{i}].passkeys[{j}]");
                let credential_id = URL_SAFE_NO_PAD
                    .decode(k.id.as_bytes())
                    .map_err(|_| err(format!("`{field}.id` must be base64url without padding")))?;
                let public_key = STANDARD
                    .decode(k.public_key.as_bytes())
                    .map_err(|_| err(format!("`{field}.public_key` must be standard base64")))?;
                if let Some(other) = seen_keys.insert(format!("passkey:{}", k.id), p.name.clone()) {
                    return Err(err(format!(
                        "`{field}.id` is listed for `{other}` already: one passkey is one person"
                    )));
                }
                passkeys.push(PasskeyPublic {
                    credential_id,
                    alg: k.alg,
                    public_key,
                });
            }
            people.push(Person {
                name: p.name.clone(),
                ssh,
                passkeys,
            });
        }
        let has_passkeys = people.iter().any(|p| !p.passkeys.is_empty());
        let rp = match file.webauthn {
            Some(w) => {
                if w.rp_id.is_empty() || w.origins.is_empty() {
                    return Err(err(
                        "`webauthn`: `rp_id` and at least one of `origins` are required",
                    ));
                }
                Some(RelyingParty {
                    rp_id: w.rp_id,
                    origins: w.origins,
                })
            }
            None if has_passkeys => {
                return Err(err(
                    "`webauthn` (rp_id, origins) is required when a person has passkeys: it says which portal they sign through",
                ));
            }
            None => None,
        };
        let mut rules = Vec::new();
        for (i, r) in file.rules.into_iter().enumerate() {
            let pattern =
                glob::Pattern::new(&r.tools).map_err(|e| err(format!("`rule[{i}].tools`: {e}")))?;
            if r.approvals == 0 {
                return Err(err(format!(
                    "`rule[{i}].approvals` must be at least 1 (`unapproved = true` is how a policy-lowered write runs unsigned)"
                )));
            }
            if r.ssh_signatures > r.approvals {
                return Err(err(format!(
                    "`rule[{i}].ssh_signatures` ({}) must be at most `approvals` ({})",
                    r.ssh_signatures, r.approvals
                )));
            }
            rules.push((pattern, r));
        }
        Ok(Approvers {
            serial: file.serial,
            rp,
            people,
            rules,
            sha256,
        })
    }

    /// The first rule whose pattern matches `tool`, or None: then no write of `tool` runs.
    pub fn rule(&self, tool: &str) -> Option<Rule> {
        self.rules
            .iter()
            .find(|(p, _)| p.matches(tool))
            .map(|(_, r)| Rule {
                approvals: r.approvals,
                unapproved: r.unapproved,
                ssh_signatures: r.ssh_signatures,
                grants: r.grants,
                break_glass: r.break_glass,
            })
    }

    /// The person one of whose SSH keys is `key`.
    pub fn person_of_ssh(&self, key: &PublicKey) -> Option<&Person> {
        self.people
            .iter()
            .find(|p| p.ssh.iter().any(|k| k.key_data() == key.key_data()))
    }

    /// The person with the passkey `credential_id`, and that passkey.
    pub fn person_of_passkey(&self, credential_id: &[u8]) -> Option<(&Person, &PasskeyPublic)> {
        self.people.iter().find_map(|p| {
            p.passkeys
                .iter()
                .find(|k| k.credential_id == credential_id)
                .map(|k| (p, k))
        })
    }

    /// Why `tool` could never be approved under this file (None: it can), for the server to
    /// say before it asks anyone.
    pub fn unsatisfiable(&self, tool: &str, lowered: bool) -> Option<String> {
        let Some(rule) = self.rule(tool) else {
            return Some(format!(
                "no rule of the approvers file (sha256:{}) covers `{tool}`",
                self.sha256
            ));
        };
        if lowered {
            return (!rule.unapproved).then(|| {
                format!(
                    "the policy lowered `{tool}` below approval, but the approvers file (sha256:{}) does not allow it unapproved (`unapproved = true` in its rule)",
                    self.sha256
                )
            });
        }
        let able = self
            .people
            .iter()
            .filter(|p| !p.ssh.is_empty() || !p.passkeys.is_empty())
            .count() as u32;
        let with_ssh = self.people.iter().filter(|p| !p.ssh.is_empty()).count() as u32;
        if with_ssh < rule.ssh_signatures {
            return Some(format!(
                "`{tool}` needs {} SSH signatures, and the approvers file (sha256:{}) lists {with_ssh} people with an SSH key",
                rule.ssh_signatures, self.sha256
            ));
        }
        (able < rule.approvals).then(|| {
            format!(
                "`{tool}` needs {} people's signatures, and the approvers file (sha256:{}) lists {able} with a key",
                rule.approvals, self.sha256
            )
        })
    }
}

fn is_person_name(name: &str) -> bool {
    name.strip_prefix("person:").is_some_and(|id| {
        !id.is_empty() && id.len() <= 256 && id.chars().all(|c| c.is_ascii_graphic())
    })
}

/// An approvers file with an organisation root key's SSH signature over its exact bytes
/// (namespace `emisar-approvers`): what the server may carry to runners.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedApprovers {
    pub text: String,
    /// Armored SSHSIG.
    pub signature: String,
}

impl SignedApprovers {
    /// The file, if one of `root_keys` signed exactly these bytes.
    pub fn verify(&self, root_keys: &[PublicKey]) -> Result<Approvers, ApproversError> {
        let signer = sshsig::signer_key(&self.signature).map_err(|e| err(e.to_string()))?;
        let Some(root) = root_keys.iter().find(|k| k.key_data() == signer.key_data()) else {
            return Err(err(format!(
                "signed by {}, which is not one of this runner's `approvers_root_keys`",
                sshsig::key_id(&signer)
            )));
        };
        sshsig::verify(
            root,
            APPROVERS_NAMESPACE,
            self.text.as_bytes(),
            &self.signature,
        )
        .map_err(|e| err(format!("root signature: {e}")))?;
        Approvers::parse(&self.text)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::protocol::approval::sshsig::tests::{sign, test_key};

    pub(crate) fn file_with(people: &[(&str, u8)], rules: &str) -> String {
        let mut text = String::from("serial = 1\n");
        for (name, seed) in people {
            let line = test_key(*seed).public_key().to_openssh().unwrap();
            text.push_str(&format!(
                "[[person]]\nname = \"{name}\"\nssh = [\"{line}\"]\n"
            ));
        }
        text.push_str(rules);
        text
    }

    #[test]
    fn the_first_matching_rule_decides() {
        let a = Approvers::parse(&file_with(
            &[("alice", 1)],
            "[[rule]]\ntools = \"nomad.*\"\napprovals = 2\n[[rule]]\ntools = \"*\"\napprovals = 1\nunapproved = true\n",
        ))
        .unwrap();
        assert_eq!(a.rule("nomad.job_scale").unwrap().approvals, 2);
        assert_eq!(
            a.rule("linux.systemctl_restart"),
            Some(Rule {
                approvals: 1,
                unapproved: true,
                ssh_signatures: 0,
                grants: false,
                break_glass: false,
            })
        );
        assert!(
            a.unsatisfiable("nomad.job_scale", false)
                .unwrap()
                .contains("needs 2")
        );
        assert!(a.unsatisfiable("linux.x", false).is_none());
    }

    #[test]
    fn a_tool_no_rule_covers_never_runs() {
        let a = Approvers::parse(&file_with(&[("alice", 1)], "")).unwrap();
        assert_eq!(a.rule("linux.x"), None);
        assert!(
            a.unsatisfiable("linux.x", false)
                .unwrap()
                .contains("no rule")
        );
    }

    #[test]
    fn errors_name_the_field() {
        let key = test_key(1).public_key().to_openssh().unwrap();
        let cases = [
            ("[[person]]\nname = \"a b\"\n", "person[0].name"),
            (
                "[[person]]\nname = \"a\"\nssh = [\"nope\"]\n",
                "person[0].ssh[0]",
            ),
            (
                &format!(
                    "[[person]]\nname = \"a\"\nssh = [\"{key}\"]\n[[person]]\nname = \"b\"\nssh = [\"{key}\"]\n"
                ),
                "person[1].ssh[0]",
            ),
            (
                "[[rule]]\ntools = \"*\"\napprovals = 0\n",
                "rule[0].approvals",
            ),
            ("[[rule]]\ntools = \"[\"\napprovals = 1\n", "rule[0].tools"),
            ("colour = 1\n", "colour"),
            (
                "[[person]]\nname = \"a\"\npasskeys = [{ id = \"AA\", alg = \"ES256\", public_key = \"AA==\" }]\n",
                "webauthn",
            ),
        ];
        for (text, field) in cases {
            let e = Approvers::parse(text).unwrap_err().to_string();
            assert!(e.contains(field), "{e} does not name {field}");
        }
    }

    #[test]
    fn a_carried_file_counts_only_with_a_root_signature_over_its_exact_bytes() {
        let root = test_key(9);
        let text = file_with(&[("alice", 1)], "[[rule]]\ntools = \"*\"\napprovals = 1\n");
        let signed = SignedApprovers {
            text: text.clone(),
            signature: sign(&root, APPROVERS_NAMESPACE, text.as_bytes()),
        };
        let roots = [root.public_key().clone()];
        assert_eq!(signed.verify(&roots).unwrap().people[0].name, "alice");
        let edited = SignedApprovers {
            text: text.replace("approvals = 1", "approvals = 2"),
            ..signed.clone()
        };
        assert!(edited.verify(&roots).is_err());
        let other = [test_key(8).public_key().clone()];
        assert!(
            signed
                .verify(&other)
                .unwrap_err()
                .0
                .contains("approvers_root_keys")
        );
        let wrong_ns = SignedApprovers {
            signature: sign(&root, "emisar-approval", text.as_bytes()),
            ..signed
        };
        assert!(wrong_ns.verify(&roots).is_err());
    }
}
