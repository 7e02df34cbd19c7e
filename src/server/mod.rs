//! The server: `emisar serve`. Everything here runs on the server's host and nothing here
//! runs on a node; it reaches runners only through [`crate::protocol`] on the wire.

pub mod app;
pub mod approvals;
pub mod audit;
pub mod break_glass;
pub mod config;
pub mod db;
pub mod fleet;
pub mod gateway;
pub mod grants;
pub mod http;
pub mod login_limits;
pub mod metrics;
pub mod notices;
pub mod oidc;
pub mod passkeys;
pub mod policy;
pub mod principal;
pub mod rebinding;
pub mod runners;
pub mod secrets;
pub(crate) mod shared_limit;
pub mod tokens;
pub mod users;
