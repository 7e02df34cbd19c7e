//! `{param}` templates for HTTP paths, query values and argv elements.
//!
//! Invariant: a template never builds a shell string, a header, a host or a scheme. A filled
//! path has each value percent-encoded as one path segment, and never a `.` or `..` segment
//! (nor one that percent-decodes to them), whatever the pack's pattern admits; an argv
//! template yields exactly one argv element however the value looks.

use std::collections::BTreeSet;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
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

    /// Fills a URL path: every value is percent-encoded as a single path segment. A value
    /// that is `.` or `..` (or decodes to one) is refused: encoding leaves dots alone, and a
    /// dot segment would climb out of the template on the service's side.
    pub fn fill_path(&self, args: &Map<String, Value>) -> Result<String, String> {
        for name in self.params() {
            if let Some(text) = args.get(name).and_then(template_text)
                && is_dot_segment(&text)
            {
                return Err(format!(
                    "argument `{name}` = `{text}` would be a `.` or `..` path segment in `{}`: refused",
                    self.source
                ));
            }
        }
        let filled = self
            .fill(args, |v| utf8_percent_encode(v, SEGMENT).to_string())?
            .ok_or_else(|| format!("path `{}` refers to an absent argument", self.source))?;
        // Two values side by side (`{a}{b}`) can make a dot segment neither makes alone.
        if let Some(segment) = filled.split('/').find(|s| is_dot_segment(s)) {
            return Err(format!(
                "path `{}` filled to a `{segment}` segment, which would climb out of it: refused",
                self.source
            ));
        }
        Ok(filled)
    }

    /// Fills a query value or an argv element verbatim; `None` if a referenced param is absent.
    pub fn fill_raw(&self, args: &Map<String, Value>) -> Result<Option<String>, String> {
        self.fill(args, str::to_owned)
    }
}

/// `.` or `..`, as such or once percent-decoding (repeated, as a lenient service might) is
/// done with it.
fn is_dot_segment(segment: &str) -> bool {
    let mut text = segment.to_owned();
    // Each round strips one layer of encoding; a few rounds cover anything a service would
    // plausibly decode, and a value that still decodes further is not a dot segment yet.
    for _ in 0..8 {
        if text == "." || text == ".." {
            return true;
        }
        let decoded = percent_decode_str(&text).decode_utf8_lossy().into_owned();
        if decoded == text {
            return false;
        }
        text = decoded;
    }
    false
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

    #[test]
    fn dot_segments_are_refused() {
        let t = Template::parse("/v1/job/{job}/plan").unwrap();
        for bad in [".", "..", "%2e", "%2E%2e", ".%2e", "%252e%252E", "%25252e"] {
            let err = t.fill_path(&args(json!({"job": bad}))).unwrap_err();
            assert!(
                err.contains("`job`") && err.contains("refused"),
                "{bad}: {err}"
            );
        }
        for fine in ["...", "a..b", ".hidden", "%2e%2e%2e", "..."] {
            assert!(t.fill_path(&args(json!({"job": fine}))).is_ok(), "{fine}");
        }
        // Two values that make a dot segment only together (`%2` and `e` make `%2e`).
        let t = Template::parse("/a/{x}{y}").unwrap();
        let err = t
            .fill_path(&args(json!({"x": "%2", "y": "e"})))
            .unwrap_err();
        assert!(err.contains("climb out"), "{err}");
    }

    /// Values made only of dots and their percent-encodings, at any depth.
    fn dotty() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just(".".to_owned()),
            Just("%2e".to_owned()),
            Just("%2E".to_owned()),
            Just("%252e".to_owned()),
        ];
        prop::collection::vec(piece, 1..=2).prop_map(|p| p.concat())
    }

    proptest! {
        /// Whatever the value, a filled path segment never contains a `/`, `?` or `#` that
        /// the value brought in, is never a dot segment, and decodes back to the value.
        #[test]
        fn path_values_stay_one_segment(value in ".*") {
            let t = Template::parse("/a/{v}").unwrap();
            match t.fill_path(&args(json!({"v": value.clone()}))) {
                Ok(filled) => {
                    let seg = filled.strip_prefix("/a/").unwrap();
                    prop_assert!(!seg.contains('/') && !seg.contains('?') && !seg.contains('#'));
                    prop_assert!(!is_dot_segment(seg));
                    let decoded = percent_encoding::percent_decode_str(seg).decode_utf8().unwrap();
                    prop_assert_eq!(decoded, value);
                }
                Err(_) => prop_assert!(is_dot_segment(&value)),
            }
        }

        /// A value that is, or decodes to, `.` or `..` never fills a path, alone or beside
        /// another value.
        #[test]
        fn dot_values_never_fill_a_path(a in dotty(), b in dotty()) {
            let one = Template::parse("/a/{v}/b").unwrap();
            let decoded = percent_encoding::percent_decode_str(&a).decode_utf8().unwrap();
            let climbs = is_dot_segment(&a);
            let refused = one.fill_path(&args(json!({"v": a.clone()}))).is_err();
            prop_assert_eq!(refused, climbs);
            if decoded.len() <= 2 && decoded.chars().all(|c| c == '.') {
                prop_assert!(climbs, "{} decodes to {}", a, decoded);
            }
            let two = Template::parse("/a/{x}{y}/b").unwrap();
            let joined = format!("{a}{b}");
            if is_dot_segment(&joined) {
                let refused = two.fill_path(&args(json!({"x": a, "y": b}))).is_err();
                prop_assert!(refused);
            }
        }
    }
}
