//! The store: PostgreSQL in production, SQLite for `emisar dev`, picked by URL scheme.
//!
//! Queries are runtime `sqlx::query` calls, not the compile-time macros, because the macros
//! check every query of a crate against one database and we ship two. Each module keeps its
//! per-backend SQL next to the code that uses it; [`with_pool!`](crate::with_pool) runs one
//! block of code against whichever pool is live.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

static PG_MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");
static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

#[derive(Clone, Debug)]
pub enum Db {
    Pg(PgPool),
    Sqlite(SqlitePool),
}

/// Runs `$body` with `$pool` bound to the live pool, whichever backend it is.
#[macro_export]
macro_rules! with_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            $crate::db::Db::Pg($pool) => $body,
            $crate::db::Db::Sqlite($pool) => $body,
        }
    };
}

impl Db {
    /// Connects and brings the schema up to date.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        use anyhow::Context;
        let db = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = PgPoolOptions::new()
                .max_connections(10)
                .acquire_timeout(Duration::from_secs(5))
                .connect(url)
                .await
                .with_context(|| {
                    format!("failed to connect to PostgreSQL at {}", redact_url(url))
                })?;
            PG_MIGRATOR
                .run(&pool)
                .await
                .context("failed to migrate the PostgreSQL schema")?;
            Db::Pg(pool)
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .with_context(|| format!("invalid SQLite URL {url}"))?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .foreign_keys(true)
                .busy_timeout(Duration::from_secs(5));
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(options)
                .await
                .with_context(|| format!("failed to open SQLite database {url}"))?;
            SQLITE_MIGRATOR
                .run(&pool)
                .await
                .context("failed to migrate the SQLite schema")?;
            Db::Sqlite(pool)
        } else {
            anyhow::bail!(
                "database URL must start with postgres://, postgresql:// or sqlite: (got `{}`)",
                redact_url(url)
            );
        };
        Ok(db)
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Db::Pg(_) => "postgres",
            Db::Sqlite(_) => "sqlite",
        }
    }

    pub async fn close(&self) {
        with_pool!(self, pool => pool.close().await)
    }
}

/// Hides the password of a database URL, for messages and logs.
pub fn redact_url(url: &str) -> String {
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
