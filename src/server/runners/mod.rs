//! The server's side of its runners: `client` signs and sends calls, `registry` keeps each
//! runner's health and circuit breaker (and probes them), `budget` bounds retries.

mod breaker;
mod budget;
pub mod client;
pub mod registry;

pub use breaker::{Breaker, Rejection};
pub use budget::RetryBudget;
