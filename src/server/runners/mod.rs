//! The server's side of its runners: `client` signs and sends calls, `registry` keeps each
//! runner's health and circuit breaker (and probes them), `tls` decides how each runner is
//! trusted (its pinned certificate, the runner CA) and builds its client, `budget` bounds
//! retries.

mod breaker;
mod budget;
pub mod client;
pub mod registry;
pub mod tls;

pub use breaker::{Breaker, Rejection};
pub use budget::RetryBudget;
