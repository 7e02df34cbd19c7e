//! Label selectors: `role=edge,dc=dc1` matches the runners whose labels have every pair.
//! Agents may target runners by selector, and a token may be limited to one.

use std::collections::BTreeMap;
use std::fmt;

use crate::util::input::is_identifier;

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
    }

    /// Agents read [`PATTERN`]; validators check a selector with `parse` instead
    /// (`pack::input_validator`): the two must admit the same texts.
    #[test]
    fn the_pattern_admits_exactly_what_parse_accepts() {
        let pattern =
            jsonschema::validator_for(&serde_json::json!({"type": "string", "pattern": PATTERN}))
                .unwrap();
        let pairs = |n: usize| {
            (0..n)
                .map(|i| format!("k{i}=v{i}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let (k63, k64) = ("k".repeat(63), "k".repeat(64));
        let mut cases: Vec<String> = [
            "role=edge",
            "role=edge,dc=dc1",
            "a=b",
            "A.b@c_d-e=0x",
            "",
            "role",
            "role=",
            "=edge",
            "role=edge;rm",
            "a=b,,c=d",
            "a=b,",
            ",a=b",
            "a=b=c",
            "-a=b",
            "a=-b",
            "_a=b",
            "a=b c",
            "a=b\n",
            "\u{e9}=x",
            "a=b,c",
        ]
        .map(str::to_owned)
        .to_vec();
        cases.extend([
            format!("{k63}={k63}"),
            format!("{k64}=v"),
            format!("k={k64}"),
            format!("a=b,{k63}={k64}"),
            pairs(16),
            pairs(17),
        ]);
        for case in &cases {
            assert_eq!(
                pattern.is_valid(&serde_json::json!(case)),
                Selector::parse(case).is_ok(),
                "{case:?}"
            );
        }
        assert!(Selector::parse(&pairs(16)).is_ok() && Selector::parse(&pairs(17)).is_err());
    }
}
