//! Checks on input: text that arrives from outside (an agent, a browser, a joining runner)
//! before it is stored, logged or used as a metric label.
//!
//! Two shapes cover every field. An *identifier* (tool, login, runner, agent and label names)
//! is 1 to [`MAX_IDENTIFIER`] ASCII letters, digits or `_ . @ -`, starting with a letter or a
//! digit ([`is_identifier`], the one definition everything uses). *Text* (a
//! call's reason, a denial note) is at most a stated number of characters and holds no NUL,
//! no other control character but tab, newline and carriage return, and no invisible
//! formatting character (bidirectional overrides and isolates, zero-width spaces), which
//! could make what an approver reads differ from what is stored. A *line* (a query filter) is
//! text without tab, newline or carriage return either.
//!
//! Invariant: an error never repeats the bytes it refuses. It names the field and the rule,
//! and says where the first offending character is by its position and code point; the
//! audit log gets [`rendering`] (an escaped preview, the length and the SHA-256) instead.

use serde_json::{Value, json};

use crate::digest::sha256_hex;

/// The longest identifier, in bytes (all of them ASCII). Long enough for any pack, tool,
/// runner or person's name (`nomad.task_resources_set`, `getty@tty1`), short enough to be an
/// index key and a metric label.
pub const MAX_IDENTIFIER: usize = 128;

/// [`is_identifier`] as a JSON Schema pattern, for the schemas agents read (a tool's
/// identifier params, a cluster tool's runner names).
pub const IDENTIFIER_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$";

/// The one definition of an identifier, for every name that comes from outside (tools,
/// people, agents, runners, labels): 1 to [`MAX_IDENTIFIER`] ASCII letters, digits or
/// `_ . @ -`, starting with a letter or digit. The length is checked first, so a 2 MB name
/// costs nothing to refuse.
pub fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_IDENTIFIER
        && s.chars().enumerate().all(|(at, c)| identifier_char(at, c))
}

/// Whether `c` may stand at position `at` (from 0) of an identifier.
fn identifier_char(at: usize, c: char) -> bool {
    c.is_ascii_alphanumeric() || (at > 0 && "_.@-".contains(c))
}

/// How many characters of a refused value the audit log keeps, escaped.
const PREVIEW_CHARS: usize = 32;

/// `value` is an identifier, or the error that names `field` and the rule.
pub fn identifier(field: &str, value: &str) -> Result<(), String> {
    if is_identifier(value) {
        return Ok(());
    }
    let rule = format!(
        "`{field}` must be an identifier: 1 to {MAX_IDENTIFIER} letters, digits or `_ . @ -`, starting with a letter or digit"
    );
    let why = if value.is_empty() {
        "it is empty".to_owned()
    } else if value.len() > MAX_IDENTIFIER {
        format!("it is {} bytes long", value.len())
    } else {
        let (at, c) = value
            .chars()
            .enumerate()
            .find(|&(at, c)| !identifier_char(at, c))
            .expect("a short non-identifier has a character out of place");
        format!("character {} is {}", at + 1, code_point(c))
    };
    Err(format!("{rule} ({why})"))
}

/// `value` is text of at most `max_chars` characters without NUL, control or invisible
/// formatting characters, or the error that names `field` and the rule.
pub fn text(field: &str, value: &str, max_chars: usize) -> Result<(), String> {
    checked(
        field,
        value,
        max_chars,
        refused_in_text,
        "other than tab, newline and carriage return",
    )
}

/// Like [`text`], and on one line: no tab, newline or carriage return either (a filter, a
/// URL, anything compared or logged as one line).
pub fn line(field: &str, value: &str, max_chars: usize) -> Result<(), String> {
    checked(
        field,
        value,
        max_chars,
        |c| refused_in_text(c) || c.is_control(),
        "tab and newline included",
    )
}

fn checked(
    field: &str,
    value: &str,
    max_chars: usize,
    refused: impl Fn(char) -> bool,
    controls: &str,
) -> Result<(), String> {
    let why = if let Some((at, c)) = value.chars().enumerate().find(|&(_, c)| refused(c)) {
        format!("character {} is {}", at + 1, code_point(c))
    } else if too_long(value, max_chars) {
        format!("it is {} bytes long", value.len())
    } else {
        return Ok(());
    };
    Err(format!(
        "`{field}` must be at most {max_chars} characters of text without NUL, control characters ({controls}) or invisible formatting characters (bidirectional overrides, zero-width spaces) ({why})"
    ))
}

/// Counting stops just past the limit, so a huge value costs no more than a small one.
fn too_long(value: &str, max_chars: usize) -> bool {
    value.len() > max_chars && value.chars().nth(max_chars).is_some()
}

/// No string in `value`, and no property name, holds NUL; otherwise the error names the
/// top-level property it was found under (by name when that is an identifier).
pub fn nul_free(field: &str, value: &Value) -> Result<(), String> {
    fn has_nul(v: &Value) -> bool {
        match v {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().any(has_nul),
            Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            _ => false,
        }
    }
    let found = match value {
        Value::Object(map) => map
            .iter()
            .find(|(k, v)| k.contains('\0') || has_nul(v))
            .map(|(k, _)| describe(k)),
        v if has_nul(v) => Some(format!("`{field}`")),
        _ => None,
    };
    match found {
        Some(place) => Err(format!(
            "`{field}`: no text may contain NUL (U+0000), and {place} does"
        )),
        None => Ok(()),
    }
}

/// The most bytes of a refused call's arguments the audit log keeps as they came; past it,
/// only their rendering.
pub const AUDIT_MAX_BYTES: usize = 64 * 1024;
/// The longest single string the audit log keeps of a refused call's arguments.
const AUDIT_MAX_STRING: usize = 4096;

/// A refused call's arguments as the audit log keeps them: as they came when they are small
/// and hold only identifiers as names and plain text as strings; otherwise each offending
/// string (and the whole, past [`AUDIT_MAX_BYTES`]) as `{"withheld": rendering}`, and each
/// property name that is not an identifier as `withheld-<sha256 prefix>` holding
/// `{"name": rendering, "value": …}`.
pub fn for_audit(args: &Value) -> Value {
    fn safe(v: &Value) -> Value {
        match v {
            Value::String(s) if s.chars().any(refused_in_text) || too_long(s, AUDIT_MAX_STRING) => {
                json!({"withheld": rendering(s)})
            }
            Value::Array(items) => Value::Array(items.iter().map(safe).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        if is_identifier(k) {
                            (k.clone(), safe(v))
                        } else {
                            (
                                format!("withheld-{}", &sha256_hex(k.as_bytes())[..16]),
                                json!({"name": rendering(k), "value": safe(v)}),
                            )
                        }
                    })
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    let whole = args.to_string();
    if whole.len() > AUDIT_MAX_BYTES {
        return json!({"withheld": rendering(&whole)});
    }
    safe(args)
}

/// A secret (a password) of at most `max_bytes` bytes without NUL. Nothing about the value
/// but its length ever appears in the error.
pub fn secret(field: &str, value: &str, max_bytes: usize) -> Result<(), String> {
    if value.len() > max_bytes {
        return Err(format!(
            "`{field}` must be at most {max_bytes} bytes (it is {} bytes long)",
            value.len()
        ));
    }
    if value.contains('\0') {
        return Err(format!("`{field}` must not contain NUL"));
    }
    Ok(())
}

/// Whether free text refuses `c`: NUL and the other control characters but tab, newline and
/// carriage return; the bidirectional marks, embeddings, overrides and isolates; and the
/// invisible zero-width space, word joiner and byte-order mark. (Zero-width joiners stay:
/// several scripts and emoji need them.)
pub fn refused_in_text(c: char) -> bool {
    (c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
        || matches!(
            c,
            '\u{061C}'
                | '\u{200B}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// How the audit log and error messages refer to a value that failed a check: an escaped
/// preview of its first characters, its length in bytes and its SHA-256 (so two refusals of
/// the same value can be matched without storing it).
pub fn rendering(value: &str) -> Value {
    json!({
        "preview": preview(value),
        "bytes": value.len(),
        "sha256": sha256_hex(value.as_bytes()),
    })
}

/// `value` for an error message: as itself in backquotes when it is an identifier, otherwise
/// described by its length, never repeated.
pub fn describe(value: &str) -> String {
    if is_identifier(value) {
        format!("`{value}`")
    } else {
        format!("a name that is not an identifier ({} bytes)", value.len())
    }
}

/// The first [`PREVIEW_CHARS`] characters with everything outside printable ASCII escaped as
/// `\u{…}`, and `…` when there was more.
fn preview(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars().take(PREVIEW_CHARS) {
        if c.is_ascii_graphic() || c == ' ' {
            out.push(c);
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    if value.chars().nth(PREVIEW_CHARS).is_some() {
        out.push('…');
    }
    out
}

fn code_point(c: char) -> String {
    if c.is_ascii_graphic() || c == ' ' {
        format!("`{c}` (U+{:04X})", c as u32)
    } else {
        format!("U+{:04X}", c as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_keep_every_real_name_and_refuse_the_rest() {
        for ok in [
            "emisar.approval_wait",
            "nomad.task_resources_set",
            "getty@tty1",
            "a",
            &"x".repeat(MAX_IDENTIFIER),
        ] {
            assert_eq!(identifier("tool", ok), Ok(()), "{ok}");
        }
        let err = identifier("tool", &"x".repeat(MAX_IDENTIFIER + 1)).unwrap_err();
        assert!(err.contains("`tool`") && err.contains("129 bytes"), "{err}");
        let err = identifier("name", "ad\0min").unwrap_err();
        assert!(err.contains("character 3 is U+0000"), "{err}");
        assert!(!err.contains('\0'));
        let err = identifier("name", ".hidden").unwrap_err();
        assert!(err.contains("character 1 is `.`"), "{err}");
        assert!(identifier("name", "").unwrap_err().contains("empty"));
    }

    /// The schema agents read and the check the server runs are one rule.
    #[test]
    fn the_schema_pattern_is_the_identifier_rule() {
        let schema = serde_json::json!({"type": "string", "pattern": IDENTIFIER_PATTERN});
        let pattern = jsonschema::validator_for(&schema).unwrap();
        let long = "x".repeat(MAX_IDENTIFIER);
        let too_long = "x".repeat(MAX_IDENTIFIER + 1);
        for name in [
            "a",
            "getty@tty1",
            "nomad.job_stop",
            "9x",
            &long,
            &too_long,
            "",
            ".a",
            "-a",
            "_a",
            "@a",
            "a b",
            "a/b",
            "a:b",
            "é",
            "a\n",
            "ａ",
        ] {
            assert_eq!(
                pattern.is_valid(&serde_json::json!(name)),
                is_identifier(name),
                "{name:?}"
            );
        }
    }

    #[test]
    fn text_refuses_nul_controls_and_invisible_formatting_and_never_echoes() {
        assert_eq!(text("reason", "restart after\tthe\r\nupgrade", 100), Ok(()));
        assert_eq!(text("reason", "é€🙂‍🙂", 5), Ok(()));
        for (bad, what) in [
            ("a\0b", "U+0000"),
            ("a\u{1b}[31m", "U+001B"),
            ("a\u{7f}", "U+007F"),
            ("a\u{85}", "U+0085"),
            ("safe\u{202E}txt.exe", "U+202E"),
            ("a\u{2066}b", "U+2066"),
            ("zero\u{200B}width", "U+200B"),
            ("\u{FEFF}bom", "U+FEFF"),
        ] {
            let err = text("note", bad, 100).unwrap_err();
            assert!(err.contains("`note`") && err.contains(what), "{err}");
            assert!(!err.contains(bad));
        }
        assert!(
            line("tool", "traefik.ping", 10)
                .unwrap_err()
                .contains("12 bytes")
        );
        let err = line("kind", "tool.called\n", 100).unwrap_err();
        assert!(err.contains("character 12 is U+000A"), "{err}");
        assert!(text("kind", "tool.called\n", 100).is_ok());
        let long = "x".repeat(2001);
        let err = text("reason", &long, 2000).unwrap_err();
        assert!(
            err.contains("at most 2000") && err.contains("2001 bytes"),
            "{err}"
        );
        assert!(
            text("reason", &"é".repeat(2000), 2000).is_ok(),
            "characters, not bytes"
        );
    }

    #[test]
    fn nul_is_found_anywhere_and_named_by_its_property() {
        assert_eq!(
            nul_free("arguments", &json!({"a": ["x", {"b": "y"}]})),
            Ok(())
        );
        let err = nul_free("arguments", &json!({"job": ["x", {"b": "y\0"}]})).unwrap_err();
        assert!(err.contains("`job` does"), "{err}");
        let err = nul_free("arguments", &json!({"k\0": 1})).unwrap_err();
        assert!(err.contains("not an identifier (2 bytes)"), "{err}");
    }

    #[test]
    fn refused_arguments_are_audited_in_a_safe_form() {
        let plain = json!({"job": "web", "count": -0.0, "list": ["a\r\nb", 1e308]});
        assert_eq!(for_audit(&plain), plain);
        let hostile = json!({"job": "x\0y", "bad name\u{202e}": "ok", "n": 1});
        let safe = for_audit(&hostile);
        assert_eq!(safe["job"]["withheld"]["bytes"], 3);
        assert_eq!(safe["n"], 1);
        let (key, kept) = safe
            .as_object()
            .unwrap()
            .iter()
            .find(|(k, _)| k.starts_with("withheld-"))
            .unwrap();
        assert_eq!(key.len(), "withheld-".len() + 16);
        assert_eq!(kept["value"], "ok");
        assert_eq!(kept["name"]["preview"], "bad name\\u{202e}");
        let huge = json!({"x": "a".repeat(AUDIT_MAX_BYTES)});
        let safe = for_audit(&huge);
        assert!(safe["withheld"]["bytes"].as_u64().unwrap() > AUDIT_MAX_BYTES as u64);
        assert!(safe.to_string().len() < 300);
    }

    #[test]
    fn secrets_are_capped_and_never_shown() {
        assert_eq!(secret("password", "correct horse", 1024), Ok(()));
        let err = secret("password", &"p".repeat(2_000_000), 1024).unwrap_err();
        assert!(
            err.contains("2000000 bytes") && !err.contains("ppp"),
            "{err}"
        );
        let err = secret("password", "hunter\u{0}2", 1024).unwrap_err();
        assert!(err.contains("NUL") && !err.contains("hunter"), "{err}");
    }

    #[test]
    fn renderings_are_short_escaped_and_identify_the_value() {
        let huge = format!("\u{202E}{}\0", "a".repeat(1_000_000));
        let r = rendering(&huge);
        let preview = r["preview"].as_str().unwrap();
        assert!(
            preview.starts_with("\\u{202e}aaa") && preview.ends_with('…'),
            "{preview}"
        );
        assert!(preview.chars().count() < 50);
        assert_eq!(r["bytes"], 1_000_004);
        assert_eq!(r["sha256"], sha256_hex(huge.as_bytes()));
        assert_eq!(rendering("a\r\nb")["preview"], "a\\u{d}\\u{a}b");
        assert_eq!(describe("traefik.ping"), "`traefik.ping`");
        assert_eq!(
            describe("x\0y"),
            "a name that is not an identifier (3 bytes)"
        );
    }
}
