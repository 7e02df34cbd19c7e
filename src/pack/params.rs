//! Typed tool parameters: what a pack may declare, the JSON Schema each type becomes, and the
//! string a value turns into when it fills a template.
//!
//! Invariant: no parameter accepts free-form text. Every string carries a pattern, an enum or
//! a known format, so an argument can never smuggle in whatever the template around it would
//! give meaning to.

use std::net::IpAddr;

use serde_json::{Map, Value, json};

use super::raw::RawParam;
use crate::util::input::{IDENTIFIER_PATTERN, MAX_IDENTIFIER, is_identifier};

/// The longest string any parameter accepts unless the pack sets `max_length`.
const DEFAULT_MAX_LENGTH: u64 = 256;

#[derive(Debug, Clone, PartialEq)]
pub enum ParamType {
    /// Text constrained by a regex pattern or an enum (at least one of them).
    String {
        pattern: Option<String>,
        choices: Option<Vec<String>>,
        max_length: u64,
    },
    Integer {
        min: Option<i64>,
        max: Option<i64>,
    },
    Boolean,
    /// An IPv4 or IPv6 address.
    Ip,
    /// An IPv4 or IPv6 prefix such as `10.0.0.0/24`.
    Cidr,
    /// A BGP autonomous system number (1 ..= 4294967295).
    Asn,
    /// A systemd unit name by systemd's own grammar (no leading `-`, so never an option).
    SystemdUnit,
    /// A name such as a job, service or node: letters, digits, `_ . @ -`, not starting with a symbol.
    Identifier,
    /// A duration such as `30s`, `5m`, `250ms`.
    Duration,
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub kind: ParamType,
    pub description: String,
    pub required: bool,
    pub secret: bool,
    /// The runner-side allowlist the value must be in, if any.
    pub allowlist: Option<String>,
    /// The policy-only list the value must be in, if any (see `RawParam::policy_allowlist`).
    pub policy_allowlist: Option<String>,
}

impl Param {
    pub(super) fn from_raw(name: &str, raw: &RawParam) -> Result<Self, String> {
        if !is_identifier(name) || name == "runners" || name == "reason" {
            return Err(format!(
                "param name `{name}` must be an identifier and not `runners` or `reason`"
            ));
        }
        let constrained = |what: &str| -> Result<(), String> {
            let extra = raw.pattern.is_some() || raw.choices.is_some() || raw.max_length.is_some();
            let bounds = raw.min.is_some() || raw.max.is_some();
            if extra || (bounds && what != "integer") {
                return Err(format!(
                    "param `{name}` of type {what} takes no pattern, enum, max_length{}",
                    if what == "integer" {
                        ""
                    } else {
                        ", min or max"
                    }
                ));
            }
            Ok(())
        };
        let kind = match raw.kind.as_str() {
            "string" => {
                if raw.pattern.is_none() && raw.choices.is_none() {
                    return Err(format!(
                        "param `{name}` is a free-form string: give it a pattern, an enum or a typed format (identifier, ip, cidr, systemd_unit, duration)"
                    ));
                }
                if raw.min.is_some() || raw.max.is_some() {
                    return Err(format!("param `{name}` of type string takes no min or max"));
                }
                if let Some(p) = &raw.pattern {
                    check_anchored_pattern(name, p)?;
                }
                ParamType::String {
                    pattern: raw.pattern.clone(),
                    choices: raw.choices.clone(),
                    max_length: raw.max_length.unwrap_or(DEFAULT_MAX_LENGTH),
                }
            }
            "integer" => {
                if raw.pattern.is_some() || raw.choices.is_some() || raw.max_length.is_some() {
                    return Err(format!(
                        "param `{name}` of type integer takes no pattern, enum or max_length"
                    ));
                }
                if let (Some(lo), Some(hi)) = (raw.min, raw.max)
                    && lo > hi
                {
                    return Err(format!("param `{name}`: min {lo} is greater than max {hi}"));
                }
                ParamType::Integer {
                    min: raw.min,
                    max: raw.max,
                }
            }
            other => {
                let kind = match other {
                    "boolean" => ParamType::Boolean,
                    "ip" => ParamType::Ip,
                    "cidr" => ParamType::Cidr,
                    "asn" => ParamType::Asn,
                    "systemd_unit" => ParamType::SystemdUnit,
                    "identifier" => ParamType::Identifier,
                    "duration" => ParamType::Duration,
                    _ => {
                        return Err(format!(
                            "param `{name}` has unknown type `{other}` (expected string, integer, boolean, ip, cidr, asn, systemd_unit, identifier or duration)"
                        ));
                    }
                };
                constrained(other)?;
                kind
            }
        };
        Ok(Param {
            name: name.to_owned(),
            kind,
            description: raw.description.clone().unwrap_or_default(),
            required: raw.required,
            secret: raw.secret,
            allowlist: list_name(name, "allowlist", &raw.allowlist)?,
            policy_allowlist: list_name(name, "policy_allowlist", &raw.policy_allowlist)?,
        })
    }

    /// Every list the value must be in, with its name: the runner's `allowlist` (which the
    /// policy may repeat per runner) and the policy's own `policy_allowlist`.
    pub fn policy_lists(&self) -> impl Iterator<Item = &str> {
        self.allowlist
            .iter()
            .chain(self.policy_allowlist.iter())
            .map(String::as_str)
    }

    /// The JSON Schema of this parameter, as it appears in the MCP input schema.
    pub fn schema(&self) -> Value {
        let mut s = match &self.kind {
            ParamType::String {
                pattern,
                choices,
                max_length,
            } => {
                let mut s = json!({"type": "string", "maxLength": max_length});
                if let Some(p) = pattern {
                    s["pattern"] = json!(p);
                }
                if let Some(c) = choices {
                    s["enum"] = json!(c);
                }
                s
            }
            ParamType::Integer { min, max } => {
                let mut s = json!({"type": "integer"});
                if let Some(m) = min {
                    s["minimum"] = json!(m);
                }
                if let Some(m) = max {
                    s["maximum"] = json!(m);
                }
                s
            }
            ParamType::Boolean => json!({"type": "boolean"}),
            ParamType::Ip => json!({"type": "string", "format": "ip", "maxLength": 64}),
            ParamType::Cidr => json!({"type": "string", "format": "cidr", "maxLength": 64}),
            ParamType::Asn => json!({"type": "integer", "minimum": 1, "maximum": 4_294_967_295u64}),
            ParamType::SystemdUnit => {
                json!({"type": "string", "format": "systemd-unit", "maxLength": 255})
            }
            ParamType::Identifier => {
                json!({"type": "string", "pattern": IDENTIFIER_PATTERN, "maxLength": MAX_IDENTIFIER})
            }
            ParamType::Duration => {
                json!({"type": "string", "pattern": "^[0-9]{1,6}(ms|s|m|h)$", "maxLength": 8})
            }
        };
        if !self.description.is_empty() {
            s["description"] = json!(self.description);
        }
        s
    }
}

/// A pattern must match the whole value: unanchored patterns let anything through around a match.
fn check_anchored_pattern(name: &str, pattern: &str) -> Result<(), String> {
    if !pattern.starts_with('^') || !pattern.ends_with('$') {
        return Err(format!(
            "param `{name}`: pattern `{pattern}` must be anchored with ^ and $"
        ));
    }
    Ok(())
}

/// Builds the JSON Schema object for a set of params (additional properties refused).
pub(super) fn object_schema<'a>(params: impl IntoIterator<Item = &'a Param>) -> Map<String, Value> {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for p in params {
        properties.insert(p.name.clone(), p.schema());
        if p.required {
            required.push(json!(p.name));
        }
    }
    let mut schema = Map::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), Value::Object(properties));
    schema.insert("required".into(), Value::Array(required));
    schema.insert("additionalProperties".into(), json!(false));
    schema
}

/// Compiles a validator that knows emisar's own formats (ip, cidr, systemd-unit, and
/// selector: what [`crate::selector::Selector::parse`] accepts).
pub(super) fn compile_validator(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .should_validate_formats(true)
        .with_format("ip", |s: &str| s.parse::<IpAddr>().is_ok())
        .with_format("cidr", is_cidr)
        .with_format("systemd-unit", is_systemd_unit)
        .with_format(SELECTOR_FORMAT, |s: &str| {
            crate::selector::Selector::parse(s).is_ok()
        })
        .build(schema)
        .map_err(|e| format!("invalid schema: {e}"))
}

/// The format a validator checks a `selector` with, in place of [`crate::selector::PATTERN`]
/// (see [`super::input_validator`]).
pub(super) const SELECTOR_FORMAT: &str = "selector";

/// Validates `args` and returns every error as "`field`: rule broken".
///
/// An error quotes the value it refuses only when the value is short printable ASCII and not
/// one of the `secret` params: a secret never appears (the error text is audited), and a
/// long or binary value is described by its length instead of being repeated. Property
/// names that are not in the schema are named only when they are identifiers.
pub fn validate(
    validator: &jsonschema::Validator,
    args: &Value,
    secret: &[&str],
) -> Result<(), Vec<String>> {
    let errors: Vec<String> = validator
        .iter_errors(args)
        .map(|e| {
            let path = e.instance_path().to_string();
            let field = path.trim_start_matches('/').replace('/', ".");
            let param = field.split('.').next().unwrap_or_default();
            let message = match e.kind() {
                jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } => {
                    let names: Vec<String> = unexpected
                        .iter()
                        .map(|n| crate::util::input::describe(n))
                        .collect();
                    format!(
                        "properties the tool does not take are not allowed: {}",
                        names.join(", ")
                    )
                }
                _ if secret.contains(&param) => e.masked_with("the value (secret)").to_string(),
                _ if !quotable(e.instance()) => e
                    .masked_with(format!(
                        "the value ({} bytes)",
                        e.instance().to_string().len()
                    ))
                    .to_string(),
                _ => e.to_string(),
            };
            if field.is_empty() {
                message
            } else {
                format!("`{field}`: {message}")
            }
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Whether an error message may repeat `value`: short, printable ASCII only.
fn quotable(value: &Value) -> bool {
    let text = value.to_string();
    text.len() <= 64 && text.chars().all(|c| c.is_ascii_graphic() || c == ' ')
}

fn is_cidr(s: &str) -> bool {
    let Some((addr, len)) = s.split_once('/') else {
        return false;
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return false;
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    !len.is_empty()
        && len.len() <= 3
        && len.chars().all(|c| c.is_ascii_digit())
        && len.parse::<u8>().is_ok_and(|l| l <= max)
}

/// systemd's unit name grammar (`unit_name_is_valid` in src/basic/unit-name.c): at most 255
/// characters of `[A-Za-z0-9:_.\-]` with an optional `@instance`, optionally ending in a unit
/// type suffix. Unlike systemd we also refuse a leading `-` or `.`, so a unit name can never be
/// read as a command-line option.
pub(super) fn is_systemd_unit(s: &str) -> bool {
    const SUFFIXES: [&str; 11] = [
        "service",
        "socket",
        "target",
        "device",
        "mount",
        "automount",
        "swap",
        "timer",
        "path",
        "slice",
        "scope",
    ];
    if s.is_empty() || s.len() > 255 || s.starts_with('-') || s.starts_with('.') {
        return false;
    }
    let valid_char = |c: char| c.is_ascii_alphanumeric() || ":_.\\-".contains(c);
    let (prefix, instance) = match s.split_once('@') {
        Some((p, i)) => (p, Some(i)),
        None => (s, None),
    };
    if prefix.is_empty() || !prefix.chars().all(valid_char) {
        return false;
    }
    match instance {
        None => true,
        // A template instance: `getty@tty1.service` or the bare template `getty@.service`.
        Some(rest) => {
            let (inst, suffix) = match rest.rsplit_once('.') {
                Some((i, sfx)) if SUFFIXES.contains(&sfx) => (i, Some(sfx)),
                _ => (rest, None),
            };
            !rest.contains('@')
                && inst.chars().all(valid_char)
                && (suffix.is_some() || !inst.is_empty())
        }
    }
}

/// A param's list name (`key`: `allowlist` or `policy_allowlist`), which must be an identifier.
fn list_name(param: &str, key: &str, raw: &Option<String>) -> Result<Option<String>, String> {
    match raw {
        Some(a) if !is_identifier(a) => Err(format!(
            "param `{param}`: {key} `{a}` must be an identifier"
        )),
        other => Ok(other.clone()),
    }
}

/// The form in which a value is compared with a runner's allowlist: systemd units without a
/// type suffix are services, so `consul` and `consul.service` are the same entry.
fn allowlist_key(kind: &ParamType, value: &str) -> String {
    if *kind == ParamType::SystemdUnit && !value.contains('.') {
        return format!("{value}.service");
    }
    value.to_owned()
}

/// Whether an allowlist (a runner's `[allowlists]`, or the policy's per-runner lists) admits
/// `value` of a param of type `kind`. The one comparison both the policy and the runner make,
/// so neither can admit what the other refuses.
///
/// A value is compared as the text it fills a template with ([`template_text`]), numbers and
/// booleans included, in the form [`allowlist_key`] gives it: what is compared is exactly
/// what would run. A value that fills no template (an array, an object, null) is never
/// admitted.
pub fn allowlist_admits(kind: &ParamType, value: &Value, list: &[String]) -> bool {
    let Some(text) = template_text(value) else {
        return false;
    };
    let wanted = allowlist_key(kind, &text);
    list.iter()
        .any(|entry| allowlist_key(kind, entry) == wanted)
}

/// How a refusal names `param`'s `value`: in backquotes as it would fill a template, or
/// `(secret)` for a secret param, whose value no refusal may echo. The policy and the runner
/// word their allowlist refusals with it.
pub fn shown_value(param: &Param, value: &Value) -> String {
    if param.secret {
        return "(secret)".to_owned();
    }
    format!(
        "`{}`",
        template_text(value).unwrap_or_else(|| value.to_string())
    )
}

/// The text a JSON value becomes inside a template. Only scalars can fill a template.
pub fn template_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: &str) -> RawParam {
        RawParam {
            kind: kind.into(),
            description: None,
            required: true,
            pattern: None,
            choices: None,
            min: None,
            max: None,
            max_length: None,
            secret: false,
            allowlist: None,
            policy_allowlist: None,
        }
    }

    #[test]
    fn free_form_strings_are_refused() {
        let err = Param::from_raw("job", &raw("string")).unwrap_err();
        assert!(err.contains("free-form"), "{err}");
        let mut p = raw("string");
        p.pattern = Some("[a-z]+".into());
        assert!(Param::from_raw("job", &p).unwrap_err().contains("anchored"));
        p.pattern = Some("^[a-z]+$".into());
        assert!(Param::from_raw("job", &p).is_ok());
    }

    #[test]
    fn reserved_and_bad_names_are_refused() {
        assert!(Param::from_raw("reason", &raw("identifier")).is_err());
        assert!(Param::from_raw("runners", &raw("identifier")).is_err());
        assert!(Param::from_raw("-x", &raw("identifier")).is_err());
        assert!(
            Param::from_raw("x", &raw("float"))
                .unwrap_err()
                .contains("unknown type")
        );
    }

    #[test]
    fn list_names_are_identifiers_and_both_are_checked_by_the_policy() {
        let mut p = raw("identifier");
        p.policy_allowlist = Some("no such list".into());
        assert_eq!(
            Param::from_raw("job", &p).unwrap_err(),
            "param `job`: policy_allowlist `no such list` must be an identifier"
        );
        p.policy_allowlist = Some("jobs".into());
        p.allowlist = Some("units".into());
        let param = Param::from_raw("job", &p).unwrap();
        assert_eq!(param.policy_lists().collect::<Vec<_>>(), ["units", "jobs"]);
    }

    #[test]
    fn systemd_unit_grammar() {
        for ok in [
            "consul",
            "consul.service",
            "getty@tty1.service",
            "getty@.service",
            "a:b_c.d-e",
        ] {
            assert!(is_systemd_unit(ok), "{ok}");
        }
        for bad in [
            "",
            "-consul",
            ".x",
            "con sul",
            "a;b",
            "a$(x)",
            "a@b@c",
            &"x".repeat(256),
        ] {
            assert!(!is_systemd_unit(bad), "{bad}");
        }
    }

    #[test]
    fn cidr_format() {
        assert!(is_cidr("10.0.0.0/24"));
        assert!(is_cidr("fd00::/8"));
        assert!(!is_cidr("10.0.0.0/33"));
        assert!(!is_cidr("10.0.0.0"));
        assert!(!is_cidr("x/8"));
    }

    #[test]
    fn allowlists_compare_what_would_run() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let unit = ParamType::SystemdUnit;
        let units = list(&["consul", "nomad.service"]);
        assert!(allowlist_admits(&unit, &json!("consul"), &units));
        assert!(allowlist_admits(&unit, &json!("consul.service"), &units));
        assert!(allowlist_admits(&unit, &json!("nomad"), &units));
        assert!(!allowlist_admits(&unit, &json!("vault"), &units));
        // Numbers are compared too, by the text they fill a template with.
        let port = ParamType::Integer {
            min: None,
            max: None,
        };
        let ports = list(&["8080", "8443"]);
        assert!(allowlist_admits(&port, &json!(8080), &ports));
        assert!(!allowlist_admits(&port, &json!(9090), &ports));
        assert!(!allowlist_admits(&port, &json!(8080.5), &ports));
        assert!(allowlist_admits(
            &ParamType::Boolean,
            &json!(true),
            &list(&["true"])
        ));
        assert!(!allowlist_admits(
            &ParamType::Boolean,
            &json!(false),
            &list(&["true"])
        ));
        // What fills no template is never admitted, whatever the list holds.
        for odd in [json!(null), json!(["8080"]), json!({"p": 8080})] {
            assert!(!allowlist_admits(&port, &odd, &ports), "{odd}");
        }
        assert!(!allowlist_admits(&port, &json!(8080), &[]));
    }

    #[test]
    fn validation_names_the_field_and_the_rule() {
        let mut unit = Param::from_raw("unit", &raw("systemd_unit")).unwrap();
        unit.required = true;
        let port = Param::from_raw(
            "port",
            &RawParam {
                min: Some(1),
                max: Some(65535),
                ..raw("integer")
            },
        )
        .unwrap();
        let schema = Value::Object(object_schema([&unit, &port]));
        let v = compile_validator(&schema).unwrap();
        assert!(validate(&v, &json!({"unit": "consul", "port": 80}), &[]).is_ok());
        let errs = validate(&v, &json!({"unit": "-x", "port": 0, "extra": 1}), &[]).unwrap_err();
        let all = errs.join("\n");
        assert!(all.contains("`unit`"), "{all}");
        assert!(all.contains("`port`"), "{all}");
        assert!(all.contains("extra"), "{all}");
        let errs = validate(&v, &json!({}), &[]).unwrap_err().join("\n");
        assert!(errs.contains("\"unit\" is a required property"), "{errs}");
    }

    #[test]
    fn errors_never_repeat_secrets_long_values_or_hostile_names() {
        let mut password = Param::from_raw(
            "password",
            &RawParam {
                pattern: Some("^[ -~]{1,16}$".into()),
                ..raw("string")
            },
        )
        .unwrap();
        password.secret = true;
        let user = Param::from_raw("user", &raw("identifier")).unwrap();
        let v = compile_validator(&Value::Object(object_schema([&password, &user]))).unwrap();
        let secret = "hunter2-but-far-too-long\n";
        let errs = validate(&v, &json!({"password": secret}), &["password"])
            .unwrap_err()
            .join("\n");
        assert!(
            errs.contains("`password`: the value (secret) does not match"),
            "{errs}"
        );
        assert!(!errs.contains("hunter2"), "{errs}");
        let huge = "a".repeat(1_000_000);
        let errs = validate(&v, &json!({"user": huge}), &[])
            .unwrap_err()
            .join("\n");
        assert!(errs.contains("`user`: the value (1000002 bytes)"), "{errs}");
        assert!(errs.len() < 500, "{} bytes of errors", errs.len());
        let errs = validate(&v, &json!({"user": "a\u{202e}b"}), &[])
            .unwrap_err()
            .join("\n");
        assert!(!errs.contains('\u{202e}'), "{errs}");
        let errs = validate(&v, &json!({"ok_name": 1, "bad\u{0}name": 2}), &[])
            .unwrap_err()
            .join("\n");
        assert!(errs.contains("`ok_name`"), "{errs}");
        assert!(
            errs.contains("a name that is not an identifier (8 bytes)"),
            "{errs}"
        );
        assert!(!errs.contains('\0'));
        let errs = validate(&v, &json!({"user": "-x"}), &[])
            .unwrap_err()
            .join("\n");
        assert!(
            errs.contains("\"-x\""),
            "short printable values are quoted: {errs}"
        );
    }
}
