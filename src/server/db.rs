//! The store: PostgreSQL in production, SQLite for `emisar dev`, picked by URL scheme, behind
//! a gate that keeps a store outage from turning into a connection storm.
//!
//! Queries are runtime `sqlx::query` calls, not the compile-time macros, because the macros
//! check every query of a crate against one database and we ship two. A statement is written
//! once, for PostgreSQL, next to the code that uses it: [`Db::sql`] drops the casts SQLite
//! has no types for, [`Db::at_text`] selects a timestamp as the same text on both, and
//! [`with_pool!`](crate::with_pool) runs one block of code against whichever pool is live.
//! Only where the backends differ in kind is the SQL written twice (the audit log's batch
//! insert and its append lock, the approvals' row locks, a join's write).
//!
//! Invariant: while the store is down, no request opens a connection. The first connection
//! failure closes the gate (and cancels every query waiting in it, so sqlx's own connect
//! retries stop too); one prober then tries a single connection at a time, with capped
//! exponential backoff and full jitter, and reopens the gate when one succeeds.

use std::borrow::Cow;
use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, ConnectOptions};
use tokio::sync::watch;

use crate::util::Backoff;

static PG_MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");
static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// The migration versions a database has applied; none when it has no migrations table yet
/// (an empty database), which is the one error expected here.
macro_rules! applied_versions {
    ($pool:expr) => {
        sqlx::query_scalar::<_, i64>("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all($pool)
            .await
            .map(|v| v.into_iter().collect::<std::collections::BTreeSet<i64>>())
            .unwrap_or_default()
    };
}

/// The migrations of `migrator` not in `before`, as `version description`.
fn newly_applied(migrator: &Migrator, before: &std::collections::BTreeSet<i64>) -> Vec<String> {
    migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && !before.contains(&m.version))
        .map(|m| format!("{} {}", m.version, m.description))
        .collect()
}

/// The longest one probe connection may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A pooled PostgreSQL connection idle longer than this is pinged before it is used.
pub(crate) const PING_IDLE: Duration = Duration::from_secs(1);
/// Connections to PostgreSQL per process: the approval transitions in flight (ten, each
/// holding one while it waits on the audit writer), the audit writer, the LISTEN connection
/// and every other store operation.
pub(crate) const PG_POOL_SIZE: u32 = 16;

#[derive(Clone, Debug)]
pub enum Pool {
    Pg(PgPool),
    Sqlite(SqlitePool),
}

#[derive(Clone, Debug)]
pub struct Db {
    pool: Pool,
    gate: Arc<Gate>,
}

#[derive(Debug)]
struct Gate {
    /// `true` while the store is believed reachable.
    up: watch::Sender<bool>,
    /// Why and since when it is down (for messages).
    down: Mutex<Option<(chrono::DateTime<chrono::Utc>, String)>>,
}

/// Runs `$body` with `$pool` bound to the live pool, whichever backend it is.
#[macro_export]
macro_rules! with_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db.pool() {
            $crate::server::db::Pool::Pg($pool) => $body,
            $crate::server::db::Pool::Sqlite($pool) => $body,
        }
    };
}

impl Db {
    /// Connects and brings the schema up to date.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        Ok(Self::connect_and_migrate(url).await?.0)
    }

    /// Connects, brings the schema up to date, and says which migrations this call applied
    /// (`version description`, oldest first; empty when the schema was up to date).
    pub(crate) async fn connect_and_migrate(url: &str) -> anyhow::Result<(Self, Vec<String>)> {
        use anyhow::Context;
        let (pool, applied) = if url.starts_with("postgres://") || url.starts_with("postgresql://")
        {
            // PostgreSQL sends a NOTICE for every `CREATE … IF NOT EXISTS` that finds the
            // object there (sqlx's own `_sqlx_migrations` on every start), which sqlx logs at
            // WARN; only warnings and worse are worth a line.
            let options = sqlx::postgres::PgConnectOptions::from_str(url)
                .with_context(|| format!("invalid PostgreSQL URL {}", redact_url(url)))?
                .options([("client_min_messages", "warning")]);
            let pool = PgPoolOptions::new()
                .max_connections(PG_POOL_SIZE)
                .acquire_timeout(Duration::from_secs(5))
                // By default sqlx pings every connection it hands out, a round trip before
                // each use (an audit append was six: ping, BEGIN, lock, last event, INSERT,
                // COMMIT; a read makes two appends). Only a connection idle longer than
                // PING_IDLE is pinged (one idle that long may have been cut by a restart or a
                // firewall); one that served a moment ago is used at once. If it died in between, the operation fails as a
                // connection error, `guard` marks the store down, and the probe brings it
                // back with fresh connections (what happens anyway when the database goes
                // away mid-operation).
                .test_before_acquire(false)
                .before_acquire(|conn, meta| {
                    Box::pin(async move {
                        if meta.idle_for > PING_IDLE {
                            sqlx::Connection::ping(conn).await?;
                        }
                        Ok(true)
                    })
                })
                .connect_with(options.clone())
                .await
                .with_context(|| {
                    format!("failed to connect to PostgreSQL at {}", redact_url(url))
                })?;
            let before = applied_versions!(&pool);
            // A migration is one long statement on a fresh database, not a slow query: its
            // connection logs statements over a second at DEBUG, not sqlx's WARN.
            let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect_with(
                &sqlx::ConnectOptions::log_slow_statements(
                    options,
                    log::LevelFilter::Debug,
                    Duration::from_secs(1),
                ),
            )
            .await
            .with_context(|| format!("failed to connect to PostgreSQL at {}", redact_url(url)))?;
            PG_MIGRATOR
                .run(&mut conn)
                .await
                .context("failed to migrate the PostgreSQL schema")?;
            sqlx::Connection::close(conn).await.ok();
            let applied = newly_applied(&PG_MIGRATOR, &before);
            (Pool::Pg(pool), applied)
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .with_context(|| format!("invalid SQLite URL {url}"))?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .foreign_keys(true)
                .busy_timeout(Duration::from_secs(5));
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                // A SQLite connection is a file this process holds open; no network can cut
                // it, so the ping sqlx sends before each use (a hop to the connection's
                // worker thread and back) tests nothing.
                .test_before_acquire(false)
                .connect_with(options)
                .await
                .with_context(|| format!("failed to open SQLite database {url}"))?;
            let before = applied_versions!(&pool);
            SQLITE_MIGRATOR
                .run(&pool)
                .await
                .context("failed to migrate the SQLite schema")?;
            let applied = newly_applied(&SQLITE_MIGRATOR, &before);
            (Pool::Sqlite(pool), applied)
        } else {
            anyhow::bail!(
                "database URL must start with postgres://, postgresql:// or sqlite: (got `{}`)",
                redact_url(url)
            );
        };
        let (up, _) = watch::channel(true);
        Ok((
            Db {
                pool,
                gate: Arc::new(Gate {
                    up,
                    down: Mutex::new(None),
                }),
            },
            applied,
        ))
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// One SQL text for both backends, written for PostgreSQL: on SQLite the casts it has no
    /// types for (`::timestamptz`, `::jsonb`, `::text`) are dropped, and nothing else changes.
    pub fn sql(&self, postgres: impl Into<Cow<'static, str>>) -> AssertSqlSafe<Cow<'static, str>> {
        let sql = postgres.into();
        AssertSqlSafe(match self.pool {
            Pool::Pg(_) => sql,
            Pool::Sqlite(_) => Cow::Owned(
                sql.replace("::timestamptz", "")
                    .replace("::jsonb", "")
                    .replace("::text", ""),
            ),
        })
    }

    /// The text form of a timestamp column in a `SELECT`: fixed-width RFC 3339 UTC with
    /// microseconds, the same on both backends (SQLite stores that text already).
    pub(crate) fn at_text(&self, column: &str) -> String {
        match self.pool {
            Pool::Pg(_) => {
                format!("to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
            }
            Pool::Sqlite(_) => column.to_owned(),
        }
    }

    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self.pool, Pool::Pg(_))
    }

    pub(crate) fn backend(&self) -> &'static str {
        match self.pool {
            Pool::Pg(_) => "postgres",
            Pool::Sqlite(_) => "sqlite",
        }
    }

    pub async fn close(&self) {
        with_pool!(self, pool => pool.close().await)
    }

    /// Why the store is down, if it is.
    pub fn outage(&self) -> Option<String> {
        self.gate
            .down
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(since, why)| {
                format!(
                    "the store is unavailable since {} ({why}); emisar retries it in the background",
                    since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                )
            })
    }

    /// Returns once the store is believed reachable (at once if it is).
    pub(crate) async fn until_up(&self) {
        let mut up = self.gate.up.subscribe();
        let _ = up.wait_for(|up| *up).await;
    }

    /// Opens a PostgreSQL transaction, through the gate, for a write that keeps its
    /// connection while the audit writer commits the write's event through another: first
    /// one of `slots` (kept well below the pool size, so the audit writer always finds a
    /// connection), then the transaction. The slot is held until the returned permit drops.
    pub(crate) async fn begin_holding_slot<'s>(
        &self,
        pool: &PgPool,
        slots: &'s tokio::sync::Semaphore,
    ) -> Result<
        (
            tokio::sync::SemaphorePermit<'s>,
            sqlx::Transaction<'static, sqlx::Postgres>,
        ),
        sqlx::Error,
    > {
        let slot = slots
            .acquire()
            .await
            .expect("the semaphore is never closed");
        let tx = self.guard(pool.begin()).await?;
        Ok((slot, tx))
    }

    /// Runs one store operation through the gate: refused at once while the store is down,
    /// cancelled if the store goes down while it waits, and closing the gate if it fails
    /// to reach the store.
    pub(crate) async fn guard<T>(
        &self,
        op: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, sqlx::Error> {
        let mut up = self.gate.up.subscribe();
        if !*up.borrow_and_update() {
            return Err(self.unavailable());
        }
        let result = tokio::select! {
            r = op => r,
            _ = up.wait_for(|up| !*up) => return Err(self.unavailable()),
        };
        if let Err(e) = &result
            && is_connection_error(e)
        {
            self.mark_down(e.to_string());
        }
        result
    }

    fn unavailable(&self) -> sqlx::Error {
        let message = self
            .outage()
            .unwrap_or_else(|| "the store is unavailable".into());
        sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            message,
        ))
    }

    fn mark_down(&self, why: String) {
        let mut down = self.gate.down.lock().unwrap_or_else(|p| p.into_inner());
        if down.is_some() {
            return;
        }
        tracing::error!(error = %why, "the store is unreachable; refusing store work until a probe connects");
        *down = Some((chrono::Utc::now(), why));
        drop(down);
        self.gate.up.send_replace(false);
        let db = self.clone();
        tokio::spawn(async move { db.probe_until_up().await });
    }

    /// One connection attempt at a time, backing off, until one succeeds.
    async fn probe_until_up(self) {
        let backoff = Backoff::try_new(Duration::from_millis(500), Duration::from_millis(4500))
            .expect("valid bounds");
        let mut attempt = 0;
        loop {
            tokio::time::sleep(backoff.delay(attempt)).await;
            attempt = attempt.saturating_add(1);
            let connected = match &self.pool {
                Pool::Pg(p) => tokio::time::timeout(PROBE_TIMEOUT, p.connect_options().connect())
                    .await
                    .map(|r| r.map(|_| ())),
                Pool::Sqlite(p) => {
                    tokio::time::timeout(PROBE_TIMEOUT, p.connect_options().connect())
                        .await
                        .map(|r| r.map(|_| ()))
                }
            };
            match connected {
                Ok(Ok(())) => break,
                Ok(Err(e)) => tracing::warn!(error = %e, attempt, "store probe failed"),
                Err(_) => tracing::warn!(attempt, "store probe timed out"),
            }
        }
        // Connections from before the outage are dead: drop them rather than fail on each.
        with_pool!(&self, pool => {
            let idle = pool.num_idle();
            for _ in 0..idle {
                if let Some(conn) = pool.try_acquire() {
                    let _ = conn.detach();
                }
            }
        });
        *self.gate.down.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.gate.up.send_replace(true);
        tracing::info!(attempts = attempt, "the store answers again");
    }
}

/// Errors that mean the store cannot be reached, as opposed to a bad query.
pub(crate) fn is_connection_error(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08xxx connection exceptions; 57P01–57P03 shutdown and "cannot connect now".
            code.starts_with("08") || matches!(code.as_ref(), "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

/// Hides the password of a database URL, for messages and logs.
pub(crate) fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
    }
}
