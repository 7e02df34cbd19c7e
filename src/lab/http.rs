//! What the lab's HTTP services share: serving a router on a fresh loopback port, the ACL
//! token a request presents, and the text/plain errors Consul and Nomad answer with.

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;

/// Serves `router` on a fresh loopback port (bound at :0) until `stop` is cancelled;
/// returns its base URL.
pub async fn serve_until(router: axum::Router, stop: CancellationToken) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await
    });
    Ok(url)
}

/// Serves `router` on a fresh loopback port until the runtime ends; returns its base URL.
pub async fn serve(router: axum::Router) -> String {
    serve_until(router, CancellationToken::new())
        .await
        .expect("a loopback port is free")
}

/// The ACL token a request carries: in the service's own header, or as a bearer token (both
/// Consul and Nomad accept either).
pub fn presented_token<'a>(headers: &'a HeaderMap, own: &str) -> Option<&'a str> {
    headers.get(own).and_then(|v| v.to_str().ok()).or_else(|| {
        headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
    })
}

/// A text/plain error, the way Consul and Nomad answer.
pub fn text_error(status: u16, body: impl Into<String>) -> Response {
    (
        axum::http::StatusCode::from_u16(status)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR),
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        body.into(),
    )
        .into_response()
}
