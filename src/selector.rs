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
    pub fn parse(text: &str) -> Result<Selector, String> {
        let mut pairs = Vec::new();
        for part in text.split(',') {
            let Some((k, v)) = part.split_once('=') else {
                return Err(format!("selector `{text}`: `{part}` must be key=value"));
            };
            if !is_identifier(k) || !is_identifier(v) || k.len() > 63 || v.len() > 63 {
                return Err(format!(
                    "selector `{text}`: `{part}` must be key=value of letters, digits and `_ . @ -`"
                ));
            }
            pairs.push((k.to_owned(), v.to_owned()));
        }
        if pairs.len() > 16 {
            return Err(format!("selector `{text}` has more than 16 pairs"));
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
