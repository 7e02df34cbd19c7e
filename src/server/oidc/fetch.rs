//! HTTP to the identity provider: one client with timeouts and no redirects, and bodies read
//! up to a byte limit, so a slow, huge or redirecting answer cannot stall or bloat the server.
//!
//! Redirects are refused because every URL fetched here comes from the provider's metadata or
//! the operator's config; following a redirect would let an answer send the server elsewhere.

use std::time::Duration;

use serde::de::DeserializeOwned;

/// The largest discovery document or key set read, in bytes.
pub(crate) const METADATA_LIMIT: usize = 256 * 1024;
/// The largest token endpoint answer read, in bytes.
pub(crate) const TOKEN_LIMIT: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("request to {url} failed: {reason}")]
    Request { url: String, reason: String },
    #[error("{url} answered HTTP {status}: {excerpt}")]
    Status {
        url: String,
        status: u16,
        excerpt: String,
    },
    #[error("{url} answered more than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("{url} answered JSON this server cannot read: {reason}")]
    Json { url: String, reason: String },
}

/// The client every request to the provider goes through.
pub fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("emisar/", env!("CARGO_PKG_VERSION")))
        .build()
        // Building fails only when the TLS backend cannot initialise, which no config
        // changes; the caller cannot recover from it either.
        .expect("failed to build the HTTP client for the identity provider")
}

/// Reads at most `limit` bytes of `resp`'s body.
pub(crate) async fn read_limited(
    url: &str,
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, FetchError> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(FetchError::TooLarge {
            url: url.to_owned(),
            limit,
        });
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| FetchError::Request {
        url: url.to_owned(),
        reason: error_chain(&e),
    })? {
        if body.len() + chunk.len() > limit {
            return Err(FetchError::TooLarge {
                url: url.to_owned(),
                limit,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A short, printable excerpt of an error body: no control characters, at most 200 chars.
pub(crate) fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect();
    if text.chars().count() > 200 {
        out.push('…');
    }
    out
}

pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// GETs `url` and parses its JSON body (2xx only, at most `limit` bytes).
pub(crate) async fn get_json<T: DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    limit: usize,
) -> Result<T, FetchError> {
    let resp = http
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| FetchError::Request {
            url: url.to_owned(),
            reason: error_chain(&e),
        })?;
    let status = resp.status();
    let body = read_limited(url, resp, limit).await?;
    if !status.is_success() {
        return Err(FetchError::Status {
            url: url.to_owned(),
            status: status.as_u16(),
            excerpt: excerpt(&body),
        });
    }
    serde_json::from_slice(&body).map_err(|e| FetchError::Json {
        url: url.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_are_short_and_printable() {
        assert_eq!(excerpt(b"bad\r\nrequest\x1b[31m"), "bad  request [31m");
        let long = "x".repeat(500);
        let e = excerpt(long.as_bytes());
        assert_eq!(e.chars().count(), 201);
        assert!(e.ends_with('…'));
    }
}
