//! `{param}` templates for HTTP paths, query values and argv elements.
//!
//! Invariant: a template never builds a shell string, a header, a host or a scheme. A filled
//! path has each value percent-encoded as one path segment; an argv template yields exactly
//! one argv element however the value looks.

use std::collections::BTreeSet;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Map, Value};

use super::params::template_text;

/// Everything but RFC 3986 unreserved characters is encoded, `/` included, so a value can
/// never add a path segment or climb with `..`.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Literal(String),
    Param(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    source: String,
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses `text`; `{name}` is a placeholder, `{{` and `}}` are literal braces.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) if c.is_ascii_alphanumeric() || c == '_' => name.push(c),
                            _ => {
                                return Err(format!(
                                    "template `{text}`: a placeholder must be `{{name}}` with letters, digits or `_`"
                                ));
                            }
                        }
                    }
                    if name.is_empty() {
                        return Err(format!("template `{text}`: empty placeholder `{{}}`"));
                    }
                    if !literal.is_empty() {
                        pieces.push(Piece::Literal(std::mem::take(&mut literal)));
                    }
                    pieces.push(Piece::Param(name));
                }
                '}' => return Err(format!("template `{text}`: unmatched `}}`")),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        Ok(Template {
            source: text.to_owned(),
            pieces,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The param names this template refers to.
    pub fn params(&self) -> BTreeSet<&str> {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Param(n) => Some(n.as_str()),
                Piece::Literal(_) => None,
            })
            .collect()
    }

    /// Fills the template. `None` when a referenced param is absent; an error when a value is
    /// not a scalar.
    fn fill(
        &self,
        args: &Map<String, Value>,
        encode: impl Fn(&str) -> String,
    ) -> Result<Option<String>, String> {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Literal(l) => out.push_str(l),
                Piece::Param(name) => {
                    let Some(value) = args.get(name) else {
                        return Ok(None);
                    };
                    let text = template_text(value)
                        .ok_or_else(|| format!("argument `{name}` must be a scalar"))?;
                    out.push_str(&encode(&text));
                }
            }
        }
        Ok(Some(out))
    }

    /// Fills a URL path: every value is percent-encoded as a single path segment.
    pub fn fill_path(&self, args: &Map<String, Value>) -> Result<String, String> {
        self.fill(args, |v| utf8_percent_encode(v, SEGMENT).to_string())?
            .ok_or_else(|| format!("path `{}` refers to an absent argument", self.source))
    }

    /// Fills a query value or an argv element verbatim; `None` if a referenced param is absent.
    pub fn fill_raw(&self, args: &Map<String, Value>) -> Result<Option<String>, String> {
        self.fill(args, str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn parses_and_fills() {
        let t = Template::parse("/api/http/services/{name}").unwrap();
        assert_eq!(t.params().into_iter().collect::<Vec<_>>(), vec!["name"]);
        assert_eq!(
            t.fill_path(&args(json!({"name": "app@file"}))).unwrap(),
            "/api/http/services/app%40file"
        );
        assert_eq!(
            t.fill_path(&args(json!({"name": "../../x"}))).unwrap(),
            "/api/http/services/..%2F..%2Fx"
        );
        let t = Template::parse("--unit={unit}").unwrap();
        assert_eq!(
            t.fill_raw(&args(json!({"unit": "a b;c"})))
                .unwrap()
                .unwrap(),
            "--unit=a b;c"
        );
        assert_eq!(t.fill_raw(&args(json!({}))).unwrap(), None);
        assert_eq!(
            Template::parse("{{x}}")
                .unwrap()
                .fill_raw(&Map::new())
                .unwrap()
                .unwrap(),
            "{x}"
        );
    }

    #[test]
    fn rejects_malformed_templates() {
        for bad in ["{", "{}", "{a-b}", "}", "x{y"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        /// Whatever the value, a filled path segment never contains a `/`, `?`, `#` or `%`
        /// that the value brought in, and decodes back to the value.
        #[test]
        fn path_values_stay_one_segment(value in ".*") {
            let t = Template::parse("/a/{v}").unwrap();
            let filled = t.fill_path(&args(json!({"v": value.clone()}))).unwrap();
            let seg = filled.strip_prefix("/a/").unwrap();
            prop_assert!(!seg.contains('/') && !seg.contains('?') && !seg.contains('#'));
            let decoded = percent_encoding::percent_decode_str(seg).decode_utf8().unwrap();
            prop_assert_eq!(decoded, value);
        }
    }
}
