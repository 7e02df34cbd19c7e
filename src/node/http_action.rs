//! HTTP actions against a service on this node.
//!
//! Invariant: the scheme, host and headers come from the runner's config, never from
//! arguments; arguments only fill percent-encoded path segments and query values.

use serde_json::{Map, Value, json};

use super::config::ServiceConfig;
use crate::pack::HttpAction;
use crate::util::error_chain;

pub struct HttpResult {
    pub status: u16,
    pub body: Value,
    pub truncated: bool,
}

impl HttpResult {
    /// The value an output program sees.
    pub fn to_json(&self) -> Value {
        json!({"status": self.status, "body": self.body})
    }
}

pub async fn run(
    client: &reqwest::Client,
    service_name: &str,
    service: &ServiceConfig,
    action: &HttpAction,
    args: &Map<String, Value>,
    body: Option<&Value>,
    max_output: usize,
) -> Result<HttpResult, String> {
    let path = action.path.fill_path(args)?;
    let url = format!("{}{path}", service.base_url.trim_end_matches('/'));
    let mut query = Vec::new();
    for (key, template) in &action.query {
        if let Some(value) = template.fill_raw(args)? {
            query.push((key.as_str(), value));
        }
    }
    let method = reqwest::Method::from_bytes(action.method.as_bytes())
        .map_err(|_| format!("bad method {}", action.method))?;
    let mut request = client
        .request(method, &url)
        .query(&query)
        .timeout(action.timeout);
    for (name, value) in &service.headers {
        request = request.header(name, value);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let mut response = request
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
    if !action.accepts(status) {
        let excerpt: String = match &body {
            Value::String(s) => s.chars().take(500).collect(),
            other => other.to_string().chars().take(500).collect(),
        };
        return Err(format!("{service_name} answered HTTP {status}: {excerpt}"));
    }
    Ok(HttpResult {
        status,
        body,
        truncated,
    })
}
