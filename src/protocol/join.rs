//! The wire format of joining: `POST /api/runners/join` with a join token.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    pub name: String,
    /// Where the server reaches this runner.
    pub url: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The packs it serves, with their digests.
    pub packs: BTreeMap<String, String>,
    /// `sha256:<hex>` of the certificate the runner serves at `url`; the server pins it and
    /// refuses to call a runner that presents another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_fingerprint: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinResponse {
    pub runner_token: String,
    pub server_public_key: String,
    pub heartbeat_interval_ms: u64,
}
