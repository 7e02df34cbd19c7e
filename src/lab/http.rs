//! What the lab's HTTP services share: serving a router on a fresh loopback port, the ACL
//! token a request presents and the layer that refuses a request without it, and the
//! text/plain errors Consul and Nomad answer with.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::{Next, from_fn_with_state};
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

/// An emulated service whose requests must show its ACL token.
pub trait Guarded: Send + Sync + 'static {
    /// The refusal for a request without the right token, if any, as the service words it.
    fn refusal(&self, headers: &HeaderMap) -> Option<Response>;
}

/// `router` with every one of its routes (those added so far) behind `service`'s token: a
/// request without it gets the service's refusal before its handler runs, so no handler
/// repeats the check.
pub fn guarded<S: Guarded, T: Clone + Send + Sync + 'static>(
    router: Router<T>,
    service: Arc<S>,
) -> Router<T> {
    router.route_layer(from_fn_with_state(service, refuse_without_token::<S>))
}

async fn refuse_without_token<S: Guarded>(
    State(service): State<Arc<S>>,
    request: Request,
    next: Next,
) -> Response {
    match service.refusal(request.headers()) {
        Some(refusal) => refusal,
        None => next.run(request).await,
    }
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
