//! The server's side of its runners: `client` signs and sends calls, `registry` keeps each
//! runner's health and circuit breaker (and probes them), `tls` decides how each runner is
//! trusted (its pinned certificate, the runner CA) and builds its client, `budget` bounds
//! retries.

mod breaker;
mod budget;
pub mod client;
pub mod networks;
pub mod registry;
pub mod tls;

pub use breaker::{Breaker, Rejection};
pub use budget::RetryBudget;

/// Why [`read_capped`] gave up on a body.
#[derive(Debug)]
pub(crate) enum CappedRead {
    /// The body would have passed the bound; what was read is dropped.
    TooLarge,
    /// The connection failed while the body was read.
    Failed(reqwest::Error),
}

/// A runner's answer body, read chunk by chunk and given up as soon as it would pass `max`
/// bytes: whatever a runner (or whatever holds its address) sends, the server buffers at
/// most `max` bytes of it.
pub(crate) async fn read_capped(
    response: &mut reqwest::Response,
    max: usize,
) -> Result<Vec<u8>, CappedRead> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(CappedRead::Failed)? {
        if bytes.len() + chunk.len() > max {
            return Err(CappedRead::TooLarge);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}
