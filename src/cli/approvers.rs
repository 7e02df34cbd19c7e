//! `emisar approvers`: the approvers file runners trust (people, their keys, how many must sign
//! per tool): add and remove people and keys, sign the file with the organisation's root key,
//! show it. Every change raises `serial`, so runners that take the file from the server never
//! go back to an older one. The file is rewritten from its parsed form (comments are not kept);
//! rules (`[[rule]] tools, approvals, unapproved`) are written by hand.

use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine;
use clap::Subcommand;

use crate::protocol::approval::approvers::{ApproversFile, PasskeyEntry, PersonEntry, RuleEntry};
use crate::protocol::approval::webauthn::CoseAlg;
use crate::protocol::approval::{Approvers, SignedApprovers, sshsig};

#[derive(Subcommand)]
pub enum ApproversCommand {
    /// Add a person, or a key to a person (an ssh-ed25519 public key or a passkey).
    #[command(
        after_help = "Example: emisar approvers add --file /etc/emisar/approvers.toml --name alice --ssh-key ~/.ssh/id_ed25519.pub"
    )]
    Add {
        /// The approvers file (created if missing).
        #[arg(long)]
        file: PathBuf,
        /// The person's name: their portal user name, or `person:<id>` for a person from the
        /// identity provider.
        #[arg(long)]
        name: String,
        /// Their OpenSSH public key file (`ssh-ed25519 AAAA… comment`).
        #[arg(long, value_name = "PATH")]
        ssh_key: Option<PathBuf>,
        /// A passkey's credential id (base64url), as the portal's Passkeys page shows it.
        #[arg(long, requires_all = ["alg", "public_key"])]
        passkey: Option<String>,
        /// The passkey's algorithm: ES256 or EdDSA.
        #[arg(long, value_parser = ["ES256", "EdDSA"])]
        alg: Option<String>,
        /// The passkey's public key (SubjectPublicKeyInfo DER, standard base64).
        #[arg(long)]
        public_key: Option<String>,
    },
    /// Remove a person, or one of their SSH keys.
    #[command(
        after_help = "Example: emisar approvers remove --file /etc/emisar/approvers.toml --name alice"
    )]
    Remove {
        /// The approvers file.
        #[arg(long)]
        file: PathBuf,
        /// The person to remove (or whose key to remove).
        #[arg(long)]
        name: String,
        /// Remove only this public key of theirs (else the person and all their keys).
        #[arg(long, value_name = "PATH")]
        ssh_key: Option<PathBuf>,
    },
    /// Sign the file with the organisation's root key (SSHSIG, namespace emisar-approvers):
    /// writes FILE.sig, which the server carries to runners with `approvers_root_keys`. A file
    /// changed since a serial was signed gets its serial raised first (runners take one file
    /// per serial); FILE.signed keeps each serial signed here with its SHA-256.
    #[command(
        after_help = "Example: emisar approvers sign --file /etc/emisar/approvers.toml --ssh-key ~/.ssh/org_root.pub"
    )]
    Sign {
        /// The approvers file to sign (exactly its bytes).
        #[arg(long)]
        file: PathBuf,
        /// The root key: a private key file, or the .pub of one of the ssh-agent's keys.
        /// Default: the ssh-agent's only ssh-ed25519 key.
        #[arg(long, value_name = "PATH")]
        ssh_key: Option<PathBuf>,
    },
    /// Check the file and print its digest, serial, people, keys and rules; with
    /// --root-key, also check FILE.sig.
    #[command(
        after_help = "Example: emisar approvers show --file /etc/emisar/approvers.toml --root-key ~/.ssh/org_root.pub"
    )]
    Show {
        /// The approvers file.
        #[arg(long)]
        file: PathBuf,
        /// An organisation root public key: FILE.sig must be its signature over the file.
        #[arg(long, value_name = "PATH")]
        root_key: Option<PathBuf>,
    },
}

pub(super) fn run(command: ApproversCommand) -> anyhow::Result<()> {
    match command {
        ApproversCommand::Add {
            file,
            name,
            ssh_key,
            passkey,
            alg,
            public_key,
        } => add(
            &file,
            name,
            ssh_key.as_deref(),
            passkey_entry(passkey, alg, public_key),
        ),
        ApproversCommand::Remove {
            file,
            name,
            ssh_key,
        } => remove(&file, &name, ssh_key.as_deref()),
        ApproversCommand::Sign { file, ssh_key } => sign(&file, ssh_key.as_deref()),
        ApproversCommand::Show { file, root_key } => show(&file, root_key.as_deref()),
    }
}

/// The passkey `--passkey ID --alg ALG --public-key KEY` names (clap requires all three
/// together, and allows only ES256 and EdDSA).
fn passkey_entry(
    id: Option<String>,
    alg: Option<String>,
    public_key: Option<String>,
) -> Option<PasskeyEntry> {
    let (id, alg, public_key) = (id?, alg?, public_key?);
    Some(PasskeyEntry {
        id,
        alg: if alg == "ES256" {
            CoseAlg::ES256
        } else {
            CoseAlg::EdDSA
        },
        public_key,
    })
}

/// `approvers add`: the person (added if new) gets the SSH key and the passkey given.
fn add(
    file: &Path,
    name: String,
    ssh_key: Option<&Path>,
    passkey: Option<PasskeyEntry>,
) -> anyhow::Result<()> {
    if ssh_key.is_none() && passkey.is_none() {
        anyhow::bail!("give a key to add: --ssh-key PATH, or --passkey ID --alg --public-key");
    }
    let mut f = read_or_new(file)?;
    let i = match f.people.iter().position(|p| p.name == name) {
        Some(i) => i,
        None => {
            f.people.push(PersonEntry {
                name,
                ssh: Vec::new(),
                passkeys: Vec::new(),
            });
            f.people.len() - 1
        }
    };
    if let Some(path) = ssh_key {
        let key = read_ssh_key(path)?;
        f.people[i].ssh.push(key.to_openssh()?);
    }
    if let Some(passkey) = passkey {
        f.people[i].passkeys.push(passkey);
    }
    write(file, f)
}

/// `approvers remove`: the person, or only the SSH key given of theirs.
fn remove(file: &Path, name: &str, ssh_key: Option<&Path>) -> anyhow::Result<()> {
    let mut f = read(file)?;
    let i = f
        .people
        .iter()
        .position(|p| p.name == name)
        .with_context(|| format!("--name: nobody is called `{name}` in {}", file.display()))?;
    match ssh_key {
        None => {
            f.people.remove(i);
        }
        Some(path) => {
            let key = read_ssh_key(path)?;
            let before = f.people[i].ssh.len();
            f.people[i].ssh.retain(|l| {
                sshsig::read_public_key("ssh", l)
                    .map(|k| k.key_data() != key.key_data())
                    .unwrap_or(true)
            });
            if f.people[i].ssh.len() == before {
                anyhow::bail!("--ssh-key: `{name}` has no such key");
            }
        }
    }
    write(file, f)
}

/// The public key in the `--ssh-key` file.
fn read_ssh_key(path: &Path) -> anyhow::Result<ssh_key::PublicKey> {
    let line =
        std::fs::read_to_string(path).with_context(|| format!("--ssh-key {}", path.display()))?;
    Ok(sshsig::read_public_key("--ssh-key", &line)?)
}

/// `approvers sign`: FILE.sig over the file (its serial raised first if need be), and the
/// serial and digest signed added to FILE.signed.
fn sign(file: &Path, ssh_key: Option<&Path>) -> anyhow::Result<()> {
    let text = one_file_per_serial(file)?;
    let sig = super::ssh_sign::sign(ssh_key, sshsig::APPROVERS_NAMESPACE, text.as_bytes())?;
    let out = sig_path(file);
    std::fs::write(&out, sig).with_context(|| format!("writing {}", out.display()))?;
    let a = Approvers::parse(&text)?;
    let history = history_path(file);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&history)
        .with_context(|| format!("writing {}", history.display()))?;
    std::io::Write::write_all(&mut f, format!("{} {}\n", a.serial, a.sha256).as_bytes())
        .with_context(|| format!("writing {}", history.display()))?;
    println!(
        "signed {} (serial {}, sha256:{}) → {}",
        file.display(),
        a.serial,
        a.sha256,
        out.display()
    );
    Ok(())
}

/// `approvers show`: the file's digest, serial, people, keys and rules; with a root key,
/// FILE.sig checked against it.
fn show(file: &Path, root_key: Option<&Path>) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("--file {}", file.display()))?;
    let a = Approvers::parse(&text)?;
    print_people(file, &a);
    let f: ApproversFile = toml::from_str(&text)?;
    print_rules(&f);
    if let Some(root) = root_key {
        check_signature(file, text, root)?;
    }
    Ok(())
}

fn print_people(file: &Path, a: &Approvers) {
    println!("file: {} (sha256:{})", file.display(), a.sha256);
    println!("serial: {}", a.serial);
    if let Some(rp) = &a.rp {
        println!(
            "passkeys: rp_id {} origins {}",
            rp.rp_id,
            rp.origins.join(" ")
        );
    }
    for p in &a.people {
        println!("person {}", p.name);
        for k in &p.ssh {
            println!("  ssh {}", sshsig::key_id(k));
        }
        for k in &p.passkeys {
            println!(
                "  passkey {} {:?}",
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&k.credential_id),
                k.alg
            );
        }
    }
}

fn print_rules(f: &ApproversFile) {
    for r in &f.rules {
        println!("{}", rule_line(r));
    }
}

/// One rule as `approvers show` prints it: the tools, the people it needs, how many of them
/// must sign with SSH, and whether a lowered write may run unsigned.
fn rule_line(r: &RuleEntry) -> String {
    let mut line = format!("rule {}: {} approval(s)", r.tools, r.approvals);
    if r.ssh_signatures > 0 {
        line += &format!(", {} of them SSH signatures", r.ssh_signatures);
    }
    if r.unapproved {
        line += ", unapproved allowed when the policy lowers it";
    }
    if r.grants {
        line += ", may run under a grant";
    }
    if r.break_glass {
        line += ", honours break-glass";
    }
    line
}

/// FILE.sig must be the `--root-key`'s signature over `text`.
fn check_signature(file: &Path, text: String, root: &Path) -> anyhow::Result<()> {
    let line =
        std::fs::read_to_string(root).with_context(|| format!("--root-key {}", root.display()))?;
    let key = sshsig::read_public_key("--root-key", &line)?;
    let sig_file = sig_path(file);
    let signature = std::fs::read_to_string(&sig_file)
        .with_context(|| format!("reading {}", sig_file.display()))?;
    SignedApprovers { text, signature }.verify(std::slice::from_ref(&key))?;
    println!(
        "signature: {} is good, by {}",
        sig_file.display(),
        sshsig::key_id(&key)
    );
    Ok(())
}

fn sig_path(file: &Path) -> PathBuf {
    let mut s = file.as_os_str().to_owned();
    s.push(".sig");
    PathBuf::from(s)
}

fn history_path(file: &Path) -> PathBuf {
    let mut s = file.as_os_str().to_owned();
    s.push(".signed");
    PathBuf::from(s)
}

/// The file's text to sign, its `serial` raised above every serial signed here (FILE.signed)
/// when this exact file was not signed at its serial before: a runner takes one file per
/// serial, so a second file at a signed serial would be refused there (or, signed, replace
/// the first where it was never seen). The file is rewritten in place with only its `serial`
/// line changed.
fn one_file_per_serial(file: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("--file {}", file.display()))?;
    let a = Approvers::parse(&text)?;
    let history = history_path(file);
    let signed: Vec<(u64, String)> = match std::fs::read_to_string(&history) {
        Ok(h) => h
            .lines()
            .filter_map(|l| {
                let (s, d) = l.split_once(' ')?;
                Some((s.parse().ok()?, d.to_owned()))
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", history.display())),
    };
    if signed.iter().any(|(s, d)| *s == a.serial && *d == a.sha256) {
        return Ok(text);
    }
    let Some(highest) = signed
        .iter()
        .map(|(s, _)| *s)
        .filter(|s| *s >= a.serial)
        .max()
    else {
        return Ok(text);
    };
    let raised = highest + 1;
    let line = serial_line(&text).with_context(|| {
        format!(
            "{} has no `serial = N` line to raise: serial {} was signed before with other contents; add `serial = {raised}`",
            file.display(),
            a.serial
        )
    })?;
    let text = text.replacen(line, &format!("serial = {raised}"), 1);
    let b = Approvers::parse(&text)?;
    anyhow::ensure!(
        b.serial == raised,
        "raising the serial of {} failed",
        file.display()
    );
    replace_public(file, &text)?;
    eprintln!(
        "{}: serial {} was signed before with other contents; raised to {raised}",
        file.display(),
        a.serial
    );
    Ok(text)
}

/// The file's `serial = N` line, as written (a TOML key at the top level, by hand or by
/// `approvers add`).
fn serial_line(text: &str) -> Option<&str> {
    text.lines().find(|l| {
        l.strip_prefix("serial")
            .map(str::trim_start)
            .and_then(|r| r.strip_prefix('='))
            .is_some_and(|r| {
                let r = r.trim();
                !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit())
            })
    })
}

/// Replaces the approvers file whole (it holds public keys only: mode 0644).
fn replace_public(file: &Path, text: &str) -> anyhow::Result<()> {
    crate::util::files::replace(file, text.as_bytes(), 0o644)
}

fn read(file: &Path) -> anyhow::Result<ApproversFile> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("--file {}", file.display()))?;
    Approvers::parse(&text)?;
    Ok(toml::from_str(&text)?)
}

fn read_or_new(file: &Path) -> anyhow::Result<ApproversFile> {
    if file.exists() {
        read(file)
    } else {
        Ok(ApproversFile::default())
    }
}

/// Writes the file with `serial` raised, after checking it parses back (a change that makes it
/// invalid, such as a key listed for two people, is refused and the file left as it was).
fn write(file: &Path, mut f: ApproversFile) -> anyhow::Result<()> {
    f.serial += 1;
    let text = format!(
        "# emisar approvers file: `emisar approvers show --file {}`\n{}",
        file.display(),
        toml::to_string(&f)?
    );
    let a = Approvers::parse(&text)?;
    replace_public(file, &text)?;
    println!(
        "{}: serial {}, {} people (sha256:{}); sign it again if runners take it from the server",
        file.display(),
        a.serial,
        a.people.len(),
        a.sha256
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::approval::approvers::tests::file_with;

    #[test]
    fn a_rule_shows_its_ssh_signatures() {
        let rule = |ssh_signatures, unapproved| RuleEntry {
            tools: "linux.*".into(),
            approvals: 2,
            unapproved,
            ssh_signatures,
            grants: false,
            break_glass: false,
        };
        assert_eq!(rule_line(&rule(0, false)), "rule linux.*: 2 approval(s)");
        assert_eq!(
            rule_line(&rule(2, true)),
            "rule linux.*: 2 approval(s), 2 of them SSH signatures, unapproved allowed when the policy lowers it"
        );
    }

    #[test]
    fn a_passkey_is_named_by_all_three_flags() {
        let entry = |alg: &str| {
            passkey_entry(Some("cred".into()), Some(alg.into()), Some("MFkw".into()))
                .expect("all three given")
        };
        assert!(matches!(entry("ES256").alg, CoseAlg::ES256));
        assert!(matches!(entry("EdDSA").alg, CoseAlg::EdDSA));
        assert_eq!(entry("ES256").id, "cred");
        assert_eq!(entry("ES256").public_key, "MFkw");
        assert!(passkey_entry(None, None, None).is_none());
        assert!(passkey_entry(Some("cred".into()), None, Some("MFkw".into())).is_none());
    }

    #[test]
    fn a_changed_file_is_signed_under_a_higher_serial() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("approvers.toml");
        let text = file_with(&[("alice", 1)], "[[rule]]\ntools = \"*\"\napprovals = 1\n");
        std::fs::write(&file, &text).unwrap();
        // Never signed here: signed as it is.
        assert_eq!(one_file_per_serial(&file).unwrap(), text);
        let first = Approvers::parse(&text).unwrap();
        std::fs::write(history_path(&file), format!("1 {}\n", first.sha256)).unwrap();
        // The same file again: as it is.
        assert_eq!(one_file_per_serial(&file).unwrap(), text);
        // Changed by hand at the same serial: raised above every serial signed.
        let looser = text.replace("approvals = 1", "approvals = 1\nunapproved = true");
        std::fs::write(&file, &looser).unwrap();
        let raised = one_file_per_serial(&file).unwrap();
        assert_eq!(Approvers::parse(&raised).unwrap().serial, 2);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), raised);
        assert!(raised.contains("unapproved = true"), "{raised}");
    }
}
