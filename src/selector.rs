//! Label selectors: `role=edge,dc=dc1` matches the runners whose labels have every pair.
//! Agents may target runners by selector, and a token may be limited to one.

use std::collections::BTreeMap;
use std::fmt;

use crate::pack::is_identifier;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(Vec<(String, String)>);

/// The JSON Schema pattern of a selector (what `parse` accepts).
pub const PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}=[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}(,[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}=[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}){0,15}$";

impl Selector {
    /// Parses `key=value,key=value`. Errors say which pair breaks which rule and never
    /// repeat the text (it comes from outside, and may be anything).
    pub fn parse(text: &str) -> Result<Selector, String> {
        let mut pairs = Vec::new();
        for (i, part) in text.split(',').enumerate() {
            if i == 16 {
                return Err("a selector has at most 16 key=value pairs".into());
            }
            let Some((k, v)) = part.split_once('=') else {
                return Err(format!("selector pair {} must be key=value", i + 1));
            };
            if !is_identifier(k) || !is_identifier(v) || k.len() > 63 || v.len() > 63 {
                return Err(format!(
                    "selector pair {}: key and value must each be 1 to 63 letters, digits or `_ . @ -`, starting with a letter or digit",
                    i + 1
                ));
            }
            pairs.push((k.to_owned(), v.to_owned()));
        }
        Ok(Selector(pairs))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches() {
        let s = Selector::parse("role=edge,dc=dc1").unwrap();
        let mut labels = BTreeMap::from([("role".to_owned(), "edge".to_owned())]);
        assert!(!s.matches(&labels));
        labels.insert("dc".into(), "dc1".into());
        assert!(s.matches(&labels));
        labels.insert("dc".into(), "dc2".into());
        assert!(!s.matches(&labels));
        assert_eq!(s.to_string(), "role=edge,dc=dc1");
        for bad in ["", "role", "role=", "=edge", "role=edge;rm", "a=b,,c=d"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
        let re = regex_lite_check(PATTERN);
        assert!(re);
    }

    fn regex_lite_check(pattern: &str) -> bool {
        let v =
            jsonschema::validator_for(&serde_json::json!({"type": "string", "pattern": pattern}))
                .unwrap();
        v.is_valid(&serde_json::json!("role=edge,dc=dc1"))
            && !v.is_valid(&serde_json::json!("role=edge;x"))
    }
}
