//! Emulators of services that have no binaries on this machine (Consul, Nomad), written from
//! their documented HTTP APIs (shared/reference/ops-apis.md): same routes, field names, error
//! shapes (text/plain bodies) and Nomad's check-and-set semantics.

pub mod consul;
pub mod nomad;

/// Serves `router` on a free loopback port until the test's runtime ends; returns its base URL.
pub async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// The ACL token a request carries: in the service's own header, or as a bearer token (both
/// Consul and Nomad accept either).
pub fn presented_token<'a>(headers: &'a axum::http::HeaderMap, own: &str) -> Option<&'a str> {
    headers.get(own).and_then(|v| v.to_str().ok()).or_else(|| {
        headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
    })
}

/// A text/plain error, the way Consul and Nomad answer.
pub fn text_error(status: u16, body: impl Into<String>) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::from_u16(status).unwrap(),
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        body.into(),
    )
        .into_response()
}
