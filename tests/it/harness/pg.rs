//! A throwaway PostgreSQL for the whole test binary, and a fresh database per test.
//!
//! When `DATABASE_URL` names a PostgreSQL server, that server is used. Otherwise the first test
//! that needs one runs initdb + pg_ctl from the installed PostgreSQL 15 (as the `postgres` user
//! when the tests run as root) into a temporary directory, listening on a unix socket only.
//! A watchdog process stops the cluster (by its PID) and removes the directory once the test
//! binary exits, however it exits.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

struct Cluster {
    /// URL of the maintenance database, for CREATE/DROP DATABASE.
    admin_url: String,
    /// psql arguments that reach the admin database.
    psql_args: Vec<String>,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Runs a PostgreSQL server binary, as `postgres` when we are root.
fn pg_command(bin: &str) -> Command {
    let path = Path::new(PG_BIN).join(bin);
    assert!(
        path.exists(),
        "{} is missing: install postgresql-15 (scripts/install-test-deps does)",
        path.display()
    );
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    }
}

fn run(mut c: Command, what: &str) {
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("failed to run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn start_cluster() -> Cluster {
    if let Ok(url) = std::env::var("DATABASE_URL")
        && url.starts_with("postgres")
    {
        return Cluster {
            psql_args: vec![url.clone()],
            admin_url: url,
        };
    }
    let dir: PathBuf = tempfile::Builder::new()
        .prefix("emisar-pg-")
        .tempdir()
        .unwrap()
        .keep();
    if is_root() {
        run(
            {
                let mut c = Command::new("chown");
                c.arg("postgres:postgres").arg(&dir);
                c
            },
            "chown",
        );
    }
    let data = dir.join("data");
    let mut initdb = pg_command("initdb");
    initdb
        .arg("-D")
        .arg(&data)
        .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"]);
    run(initdb, "initdb");
    let mut ctl = pg_command("pg_ctl");
    ctl.arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.join("server.log"))
        .arg("-w")
        .arg("-o")
        .arg(format!(
            "-p 5432 -k {} -c listen_addresses='' -c fsync=off -c max_connections=300",
            dir.display()
        ))
        .arg("start");
    run(ctl, "pg_ctl start");
    let pid = std::fs::read_to_string(data.join("postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .to_owned();
    // The watchdog: once this test process is gone, stop the postmaster by PID and clean up.
    let watchdog = format!(
        "while kill -0 {me} 2>/dev/null; do sleep 0.5; done; kill -INT {pid}; \
         while kill -0 {pid} 2>/dev/null; do sleep 0.2; done; rm -rf '{dir}'",
        me = std::process::id(),
        dir = dir.display()
    );
    #[expect(
        clippy::zombie_processes,
        reason = "the watchdog must outlive this process, so nobody here waits for it"
    )]
    let _watchdog = Command::new("sh")
        .arg("-c")
        .arg(watchdog)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .expect("failed to start the PostgreSQL watchdog");
    let socket = dir.display().to_string();
    Cluster {
        admin_url: format!("postgres://postgres@localhost/postgres?host={socket}&port=5432"),
        psql_args: vec![
            "-h".into(),
            socket,
            "-p".into(),
            "5432".into(),
            "-U".into(),
            "postgres".into(),
            "-d".into(),
            "postgres".into(),
        ],
    }
}

use std::os::unix::process::CommandExt;

fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(start_cluster)
}

fn psql(sql: &str) {
    let c = cluster();
    let mut cmd = Command::new("psql");
    cmd.args(&c.psql_args)
        .args(["-v", "ON_ERROR_STOP=1", "-q", "-c", sql]);
    run(cmd, &format!("psql -c {sql}"));
}

/// A database that exists for one test and is dropped after it.
pub struct PgTestDb {
    name: String,
    pub url: String,
}

impl PgTestDb {
    pub fn create() -> Self {
        let c = cluster();
        let name = format!("emisar_test_{}", uuid::Uuid::new_v4().simple());
        psql(&format!("CREATE DATABASE {name}"));
        let url = replace_db(&c.admin_url, &name);
        PgTestDb { name, url }
    }

    /// psql's arguments that reach this test's database as the superuser (for a thread of
    /// its own that tampers while the test waits).
    pub fn superuser_args(&self) -> Vec<String> {
        let c = cluster();
        let mut args = c.psql_args.clone();
        if let Some(i) = args.iter().position(|a| a == "-d") {
            args[i + 1] = self.name.clone();
        } else {
            args[0] = self.url.clone();
        }
        args
    }

    /// Runs SQL as the superuser in this test's database (to tamper, as an attacker would).
    pub fn superuser_sql(&self, sql: &str) -> Result<String, String> {
        superuser_sql_with(&self.superuser_args(), sql)
    }
}

/// Runs SQL with psql `args` ([`PgTestDb::superuser_args`]): its output, or its error.
pub fn superuser_sql_with(args: &[String], sql: &str) -> Result<String, String> {
    let out = Command::new("psql")
        .args(args)
        .args(["-v", "ON_ERROR_STOP=1", "-q", "-At", "-c", sql])
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

impl Drop for PgTestDb {
    fn drop(&mut self) {
        psql(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

fn replace_db(url: &str, name: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let slash = base.rfind('/').expect("database URL has a path");
    let mut out = format!("{}/{name}", &base[..slash]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// A PostgreSQL cluster of one test's own, that the test may stop and start (to play an
/// outage) without disturbing the shared one. Stopped by PID and removed on drop.
pub struct DedicatedCluster {
    dir: PathBuf,
    data: PathBuf,
}

impl DedicatedCluster {
    pub fn start() -> DedicatedCluster {
        let dir: PathBuf = tempfile::Builder::new()
            .prefix("emisar-pg-own-")
            .tempdir()
            .unwrap()
            .keep();
        if is_root() {
            let mut c = Command::new("chown");
            c.arg("postgres:postgres").arg(&dir);
            run(c, "chown");
        }
        let data = dir.join("data");
        let mut initdb = pg_command("initdb");
        initdb.arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run(initdb, "initdb");
        let c = DedicatedCluster { dir, data };
        c.up();
        let mut psql = Command::new("psql");
        psql.args([
            "-h",
            c.dir.to_str().unwrap(),
            "-p",
            "5432",
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .args([
            "-v",
            "ON_ERROR_STOP=1",
            "-q",
            "-c",
            "CREATE DATABASE emisar",
        ]);
        run(psql, "create database");
        c
    }

    /// The unix socket the server listens on.
    pub fn socket(&self) -> PathBuf {
        self.dir.join(".s.PGSQL.5432")
    }

    pub fn up(&self) {
        let mut ctl = pg_command("pg_ctl");
        ctl.arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .arg("-w")
            .arg("-o")
            .arg(format!(
                "-p 5432 -k {} -c listen_addresses='' -c fsync=off",
                self.dir.display()
            ))
            .arg("start");
        run(ctl, "pg_ctl start");
    }

    /// Kills the server at once, like a crash (immediate shutdown).
    pub fn down(&self) {
        let mut ctl = pg_command("pg_ctl");
        ctl.arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"]);
        run(ctl, "pg_ctl stop");
    }
}

impl Drop for DedicatedCluster {
    fn drop(&mut self) {
        let mut ctl = pg_command("pg_ctl");
        ctl.arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"]);
        let _ = ctl.output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
