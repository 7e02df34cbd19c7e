//! A throwaway Debian package root for the real apt and dpkg: packages built with `dpkg-deb`,
//! a local `file:` repository with a hand-written Packages index, and an apt configuration
//! (`APT_CONFIG`) whose every state, cache, list, log and dpkg database lives in a temporary
//! directory. Stand-in `apt-get` and `dpkg-query` scripts for a runner's exec PATH run the
//! real programs against that root, so a test upgrades a package for real and the host's
//! /var/lib/dpkg is never touched.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

pub struct AptRoot {
    /// Everything: the packages, the repository, the root and the stand-ins.
    dir: tempfile::TempDir,
}

impl AptRoot {
    /// An empty root (no package installed) whose only source is an empty local repository.
    pub fn new() -> AptRoot {
        let root = AptRoot {
            dir: tempfile::tempdir().unwrap(),
        };
        for d in [
            "root/var/lib/dpkg/updates",
            "root/var/lib/dpkg/info",
            "root/var/lib/apt/lists/partial",
            "root/var/cache/apt/archives/partial",
            "root/etc/apt/apt.conf.d",
            "root/etc/apt/preferences.d",
            "root/etc/apt/sources.list.d",
            "root/var/log/apt",
            "repo",
            "debs",
            "bin",
        ] {
            std::fs::create_dir_all(root.dir.path().join(d)).unwrap();
        }
        std::fs::write(root.root().join("var/lib/dpkg/status"), "").unwrap();
        std::fs::write(
            root.root().join("etc/apt/sources.list"),
            format!("deb [trusted=yes] file:{} ./\n", root.repo().display()),
        )
        .unwrap();
        std::fs::write(root.apt_config(), root.apt_conf_text()).unwrap();
        root.write_standins();
        root.publish(&[]);
        root
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    fn apt_config(&self) -> PathBuf {
        self.dir.path().join("apt.conf")
    }

    fn admindir(&self) -> PathBuf {
        self.root().join("var/lib/dpkg")
    }

    /// The folder with the stand-ins, to put first on a runner's exec PATH.
    pub fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    /// The argv of every stand-in call, one `PROGRAM ARGS…` line each.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// apt's configuration: every directory inside the root (apt.conf.d included, so none of
    /// the host's hooks run), and dpkg pointed at the root and its own database.
    fn apt_conf_text(&self) -> String {
        let r = self.root().display().to_string();
        format!(
            r#"Dir "{r}/";
Dir::State "{r}/var/lib/apt/";
Dir::State::status "{r}/var/lib/dpkg/status";
Dir::Cache "{r}/var/cache/apt/";
Dir::Etc "{r}/etc/apt/";
Dir::Etc::Parts "apt.conf.d/";
Dir::Etc::main "apt.conf";
Dir::Etc::Preferences "preferences";
Dir::Etc::PreferencesParts "preferences.d/";
Dir::Etc::Trusted "trusted.gpg";
Dir::Etc::TrustedParts "trusted.gpg.d/";
Dir::Etc::SourceList "{r}/etc/apt/sources.list";
Dir::Etc::SourceParts "{r}/etc/apt/sources.list.d/";
Dir::Log "{r}/var/log/apt/";
Dir::Bin::dpkg "/usr/bin/dpkg";
Dir::Bin::methods "/usr/lib/apt/methods/";
DPkg::Options {{"--root={r}";"--admindir={r}/var/lib/dpkg";"--force-not-root";"--force-script-chrootless";"--log={r}/var/log/dpkg.log";}};
APT::Sandbox::User "root";
"#
        )
    }

    /// `apt-get` and `dpkg-query` that record their argv and run the real programs on the root.
    fn write_standins(&self) {
        let calls = self.dir.path().join("calls");
        let scripts = [
            (
                "apt-get",
                format!(
                    "APT_CONFIG='{}' exec /usr/bin/apt-get \"$@\"",
                    self.apt_config().display()
                ),
            ),
            (
                "dpkg-query",
                format!(
                    "exec /usr/bin/dpkg-query --admindir='{}' \"$@\"",
                    self.admindir().display()
                ),
            ),
        ];
        for (program, run) in scripts {
            let path = self.bin().join(program);
            let script = format!(
                "#!/bin/sh\nprintf '%s\\n' \"{program} $*\" >> '{}'\n{run}\n",
                calls.display()
            );
            std::fs::write(&path, script).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    /// Builds `name` at `version` (architecture all, one file saying its version) with
    /// `dpkg-deb --build`; returns the .deb.
    pub fn build(&self, name: &str, version: &str) -> PathBuf {
        let tree = self.dir.path().join(format!("build/{name}-{version}"));
        std::fs::create_dir_all(tree.join("DEBIAN")).unwrap();
        std::fs::create_dir_all(tree.join(format!("usr/share/{name}"))).unwrap();
        std::fs::write(
            tree.join("DEBIAN/control"),
            format!(
                "Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: emisar tests <tests@emisar.invalid>\nDescription: a package for emisar's tests\n It holds one file with its version.\n"
            ),
        )
        .unwrap();
        std::fs::write(tree.join(format!("usr/share/{name}/version")), version).unwrap();
        let deb = self
            .dir
            .path()
            .join(format!("debs/{name}_{version}_all.deb"));
        run(Command::new("dpkg-deb")
            .args(["--build", "--root-owner-group"])
            .arg(&tree)
            .arg(&deb));
        deb
    }

    /// Installs `deb` into the root with the real dpkg.
    pub fn install(&self, deb: &Path) {
        run(Command::new("/usr/bin/dpkg")
            .arg(format!("--root={}", self.root().display()))
            .arg(format!("--admindir={}", self.admindir().display()))
            .args(["--force-not-root", "--force-script-chrootless", "-i"])
            .arg(deb));
    }

    /// Makes `debs` the whole repository (a Packages index written from their control files)
    /// and runs `apt-get update` on the root.
    pub fn publish(&self, debs: &[&Path]) {
        let mut index = String::new();
        for deb in debs {
            let name = deb.file_name().unwrap();
            std::fs::copy(deb, self.repo().join(name)).unwrap();
            let bytes = std::fs::read(deb).unwrap();
            let control = run(Command::new("dpkg-deb").args(["-f"]).arg(deb));
            index.push_str(control.trim_end());
            index.push_str(&format!(
                "\nFilename: ./{}\nSize: {}\nSHA256: {}\n\n",
                name.to_string_lossy(),
                bytes.len(),
                hex::encode(Sha256::digest(&bytes))
            ));
        }
        std::fs::write(self.repo().join("Packages"), index).unwrap();
        run(Command::new("/usr/bin/apt-get")
            .env("APT_CONFIG", self.apt_config())
            .arg("update"));
    }

    /// `package`'s version and status as the root's dpkg database has them, e.g. `1.1-1 ii `.
    pub fn installed(&self, package: &str) -> String {
        run(Command::new("/usr/bin/dpkg-query")
            .arg(format!("--admindir={}", self.admindir().display()))
            .args(["-W", "-f", "${Version} ${db:Status-Abbrev}", package]))
    }

    /// The content of the one file `package` installs in the root.
    pub fn shipped_version(&self, package: &str) -> String {
        std::fs::read_to_string(self.root().join(format!("usr/share/{package}/version"))).unwrap()
    }
}

/// Runs `cmd`; panics with its output when it fails; returns its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
