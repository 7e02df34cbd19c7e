//! HTTP actions against a service on this node.
//!
//! Invariant: the scheme, host and headers come from the runner's config, never from
//! arguments; arguments only fill percent-encoded path segments and query values.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::config::ServiceConfig;
use crate::pack::HttpAction;
use crate::util::error_chain;

pub(crate) struct HttpResult {
    pub status: u16,
    pub body: Value,
    pub truncated: bool,
}

impl HttpResult {
    /// The value an output program sees.
    pub(crate) fn to_json(&self) -> Value {
        json!({"status": self.status, "body": self.body})
    }
}

/// The request an http step makes, its templates filled: what goes on the wire, less the
/// base URL and headers, which only the runner's config supplies.
#[derive(Debug)]
pub(crate) struct HttpRequest<'a> {
    pub method: &'a str,
    /// The filled path, its values percent-encoded.
    pub path: String,
    /// Query pairs whose template had a value (an absent optional param leaves its key out).
    pub query: Vec<(&'a str, String)>,
    pub body: Option<Value>,
    pub timeout: Duration,
}

/// Fills the action's templates from the step's values.
pub(crate) fn request<'a>(
    action: &'a HttpAction,
    values: &Map<String, Value>,
    body: Option<Value>,
) -> Result<HttpRequest<'a>, String> {
    let path = action.path.fill_path(values)?;
    let mut query = Vec::new();
    for (key, template) in &action.query {
        if let Some(value) = template.fill_raw(values)? {
            query.push((key.as_str(), value));
        }
    }
    Ok(HttpRequest {
        method: &action.method,
        path,
        query,
        body,
        timeout: action.timeout,
    })
}

/// Sends the request to the configured service and reads at most `max_output` bytes of the
/// answer. Any status is returned: [`accepted`] decides which ones the action takes.
pub(crate) async fn send(
    client: &reqwest::Client,
    service_name: &str,
    service: &ServiceConfig,
    request: &HttpRequest<'_>,
    max_output: usize,
) -> Result<HttpResult, String> {
    let url = format!("{}{}", service.base_url.trim_end_matches('/'), request.path);
    let method = reqwest::Method::from_bytes(request.method.as_bytes())
        .map_err(|_| format!("bad method {}", request.method))?;
    let mut builder = client
        .request(method, &url)
        .query(&request.query)
        .timeout(request.timeout);
    for (name, value) in &service.headers {
        builder = builder.header(name, value);
    }
    if let Some(body) = &request.body {
        builder = builder.json(body);
    }
    let mut response = builder
        .send()
        .await
        .map_err(|e| format!("{service_name} at {url}: {}", error_chain(&e)))?;
    let status = response.status().as_u16();
    let mut bytes = Vec::new();
    let mut truncated = false;
    while let Some(chunk) = response.chunk().await.map_err(|e| {
        format!(
            "{service_name} at {url}: reading the answer: {}",
            error_chain(&e)
        )
    })? {
        let room = max_output.saturating_sub(bytes.len());
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            truncated = true;
            break;
        }
        bytes.extend_from_slice(&chunk);
    }
    let body = if truncated {
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        text.push_str("[… answer truncated by emisar]");
        Value::String(text)
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            Value::String(String::from_utf8_lossy(&bytes).trim_end().to_owned())
        })
    };
    Ok(HttpResult {
        status,
        body,
        truncated,
    })
}

/// The answer if the action accepts its status, else the error the agent sees.
pub(crate) fn accepted(
    service_name: &str,
    action: &HttpAction,
    result: HttpResult,
) -> Result<HttpResult, String> {
    if action.accepts(result.status) {
        return Ok(result);
    }
    let excerpt: String = match &result.body {
        Value::String(s) => s.chars().take(500).collect(),
        other => other.to_string().chars().take(500).collect(),
    };
    Err(format!(
        "{service_name} answered HTTP {}: {excerpt}",
        result.status
    ))
}
