//! Reading a TOML settings file, shared by the server's and the runner's configs.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

/// Reads and parses `path`; errors name the file (and serde names the key).
pub fn read_toml<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read config {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config {}", path.display()))
}
