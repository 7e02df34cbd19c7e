//! Reading a TOML settings file, shared by the server's, the runner's and the witness's
//! configs.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

/// Reads and parses `path`; errors name the file (and serde names the key).
pub fn read_toml<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read config {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config {}", path.display()))
}

/// [`read_toml`] for a config whose schema is known: when the key an error points at is one
/// of the config's top-level keys but sits under a `[table]` header, the error says so. TOML
/// reads every key after `[allowlists]` as part of that table, so a top-level key appended
/// at the end of the file fails as `allowlists.approvers_file`, with a type error that
/// points nowhere near the real mistake.
///
/// `top_level` is the config's top-level keys: [`top_level_keys`] of its schema where the
/// build has schemas, else a list its module keeps (and a test holds to the schema).
pub fn read_config<T: for<'de> Deserialize<'de>>(
    path: &Path,
    top_level: &[&str],
) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read config {}", path.display()))?;
    toml::from_str(&text).map_err(|e| {
        let hint = e
            .span()
            .and_then(|span| misplaced_key(&text, span.start, top_level))
            .map(|(table, key)| {
                format!(
                    "\n`{key}` is a top-level key, but it comes after the `[{table}]` header, so TOML reads it as `{table}.{key}`: move it above the first `[table]` line"
                )
            })
            .unwrap_or_default();
        anyhow::anyhow!("invalid config {}: {e}{hint}", path.display())
    })
}

/// The top-level keys a config's JSON Schema declares.
#[cfg(feature = "server")]
pub fn top_level_keys(schema: schemars::Schema) -> Vec<String> {
    schema
        .get("properties")
        .and_then(|p| p.as_object())
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// The table header and key of the line holding byte `at` of `text`, when that key is one of
/// `top_level` and the line sits under a `[table]` header (not `[[array]]`, whose keys are
/// the array element's).
fn misplaced_key(text: &str, at: usize, top_level: &[&str]) -> Option<(String, String)> {
    let line_start = text[..at.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next()?;
    let key = line.split('=').next()?.trim().trim_matches('"');
    if !top_level.contains(&key) {
        return None;
    }
    let header = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))?;
    let table = header.strip_prefix('[')?.strip_suffix(']')?;
    if table.starts_with('[') {
        return None;
    }
    Some((table.trim().to_owned(), key.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_top_level_key_under_a_table_is_named_as_read() {
        let top = ["approvers_file", "name"];
        let text = "name = \"a\"\n\n[allowlists]\nsystemd_units = [\"consul\"]\napprovers_file = \"/etc/emisar/approvers\"\n";
        let at = text.find("approvers_file").unwrap() + 20;
        assert_eq!(
            misplaced_key(text, at, &top),
            Some(("allowlists".into(), "approvers_file".into()))
        );
        // Above every header it is where it belongs; a key of the table is not top-level.
        assert_eq!(misplaced_key(text, 2, &top), None);
        let at = text.find("systemd_units").unwrap();
        assert_eq!(misplaced_key(text, at, &top), None);
        // Under `[[runners]]` a key is the array element's.
        let text = "[[runners]]\nname = \"r\"\n";
        assert_eq!(misplaced_key(text, text.find("name").unwrap(), &top), None);
    }
}
