//! Test harness: databases, real Traefik, Redis and apt, certificates made at test time, and the
//! server with runners on free ports.

pub mod app;
pub mod apt;
pub mod certs;
pub mod frr;
pub mod join;
pub mod oidc;
pub mod pg;
pub mod redis;
pub mod shipped;
pub mod tools;
pub mod traefik;
pub mod vm;
pub mod vmalert;

pub use app::{RunnerSpec, spawn_app};
pub use shipped::Build;

/// Which store a test runs against.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// Expands one `async fn name(backend: Backend)` into a test per backend.
#[macro_export]
macro_rules! both_backends {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::harness::Backend::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::harness::Backend::Sqlite).await
            }
        }
    };
}

/// Expands one `async fn name(backend: Backend, build: Build)` into a test per backend for
/// each build: `postgres` and `sqlite` in this process, `shipped_postgres` and
/// `shipped_sqlite` against the binaries that ship (`harness/shipped.rs`).
#[macro_export]
macro_rules! both_backends_every_build {
    ($name:ident) => {
        mod $name {
            use $crate::harness::{Backend, Build};
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(Backend::Postgres, Build::InProcess).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(Backend::Sqlite, Build::InProcess).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn shipped_postgres() {
                super::$name(Backend::Postgres, Build::Shipped).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn shipped_sqlite() {
                super::$name(Backend::Sqlite, Build::Shipped).await
            }
        }
    };
}
