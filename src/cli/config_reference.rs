//! The configuration reference, docs/configuration.md, generated from the JSON Schemas of the
//! config structs (`ServerConfig`, `RunnerConfig`, the policy file's shape), so the document
//! cannot drift from the code: every key, its type, its default, its doc comment.
//!
//! Invariant: the committed docs/configuration.md is exactly [`generate`]'s output (a unit test
//! compares them), and every key has a description ([`undocumented`] is empty).

use std::fmt::Write as _;

use serde_json::Value;

use crate::node::config::RunnerConfig;
use crate::server::config::ServerConfig;

/// The command that rewrites the committed file; the test that compares them prints it.
pub const REGENERATE: &str =
    "EMISAR_WRITE_CONFIG_REFERENCE=1 cargo test --lib config_reference::tests::docs_are_current";

const PREFACE: &str = "# Configuration reference

<!-- Generated from the config structs by src/cli/config_reference.rs: do not edit by hand.
     Regenerate with: EMISAR_WRITE_CONFIG_REFERENCE=1 cargo test --lib config_reference::tests::docs_are_current -->

Every key of the three files an operator writes: `emisar.toml` (the server, `emisar serve
--config`), `runner.toml` (each node's runner, `emisar runner --config` or `emisar-runner`) and
the policy file (`policy_file` in emisar.toml, TOML or YAML, reloaded on SIGHUP). Unknown keys
are errors in all three, so a misspelt key never silently leaves a default in place. A key
whose default is *required* must be given; *none* means the feature is off until set.

## What operators trip on

- **`exec_path`** (runner.toml) is one colon-separated string, like `PATH`, not a list:
  `exec_path = \"/usr/sbin:/usr/bin\"`. Every directory in it must be absolute (an empty
  entry, which would mean the working directory, is refused at load). The runner looks the
  program up there itself; exec actions get it as `PATH` and `LANG`, nothing else of the
  environment.
- **`[allowlists] systemd_units`** (runner.toml): a param with `allowlist: systemd_units`
  (linux.systemctl_restart and linux.systemctl_reload) refuses every value until the runner lists it:
  `[allowlists]` then `systemd_units = [\"consul\", \"nomad\"]`. A policy file's `[runners.NAME]`
  allowlist narrows it further; it never widens it.
- **`[allowlists] debian_packages`** (runner.toml): the packages debian.package_upgrade may
  upgrade on this node, by name (`debian_packages = [\"openssl\", \"consul\"]`); none by
  default, so every upgrade is refused until the runner lists the package.
- **`labels`**: a table of strings, `labels = { role = \"edge\", dc = \"dc1\" }`, in runner.toml
  for a runner that joins, in `[[runners]]` of emisar.toml for a listed one. Selectors
  (`role=edge,dc=dc1`) in tokens and the policy match them.
- **`advertise_url`** (runner.toml): the URL the server calls a joining runner at. A runner
  listening on `0.0.0.0` (or `[::]`) must set it: the server cannot call `0.0.0.0`.
- **`programs`** (runner.toml): program name → the argv that replaces it, a list:
  `redis-cli = [\"/usr/bin/redis-cli\", \"-s\", \"/run/redis/redis-server.sock\"]`. It is how an
  exec pack reaches a non-default socket or address; packs never carry addresses.
- **`packs_dir`**: set it on the server **and** on every runner, with byte-identical files: a
  runner refuses calls to a pack whose digest differs from the server's.
- **`max_output_bytes`** (runner.toml): each action's answer (an http body, each exec stream) is
  cut at this many bytes and marked truncated; an output program then sees text, not JSON.
- **`audit_key_file`** (emisar.toml): required as soon as a loaded pack has a `secret` param
  (the audit log stores a keyed HMAC of the value); make it with `emisar keygen --audit-key FILE`.
- **`rate_limit_per_second`, `rate_limit_burst`** (emisar.toml): per agent, for tool calls:
  a token bucket that holds `rate_limit_burst` calls and refills at `rate_limit_per_second`.
  A refused call is audited as `tool.rejected` (after the first in a minute, an agent's
  rate-limited calls are counted into one `refusal.repeated` event a minute). Logins have
  their own limits in `[login]`; joins are limited to 20 a minute per client address
  (`[join] attempts_per_address_per_minute`).
  **Across replicas** (PostgreSQL) the limit holds for all of them together: each replica
  keeps its own bucket and, behind it, asks the agent's bucket in the database, which every
  replica shares. While that bucket is less than half spent, a replica admits the agent's
  calls without a round trip and reports them every 50 ms, at most `max(1, rate × 50 ms)`
  calls at a time; beyond half, each call takes one statement. The bound: over any time
  `t`, an agent is served at most `burst + rate × t` calls (what one replica serves) plus
  `replicas × max(1, rate × 50 ms)`. With the defaults (20/s, bursts of 40) and 3 replicas
  that is at most 3 calls more, whatever `t`; at 1,000 calls/s, 150. If the database does not
  answer, each replica limits on its own until it does (`emisar_rate_limit_fallbacks_total`
  counts those calls), so N replicas then allow up to N times the rate. On SQLite (one
  process) the replica's own bucket is the whole limit.
- **`health_probe_interval_ms`** (emisar.toml): how often each runner's `/healthz` is probed;
  a runner that fails probes is left out of cluster tools' picks until it answers again.
  A fleet larger than `health_probes_per_second` × the interval is probed less often, so
  the whole fleet gets at most that many probes a second (1,000 runners at the defaults:
  each every 20 s). A failing runner is probed again sooner, on its own backoff.
";

/// One documented key.
struct Row {
    key: String,
    kind: String,
    default: String,
    description: String,
    example: String,
}

/// The whole docs/configuration.md.
pub fn generate() -> String {
    let mut out = String::from(PREFACE);
    for (title, file, schema) in files() {
        let _ = write!(out, "\n## {title}\n\n");
        let description = text(&schema, "description");
        if !description.is_empty() {
            let _ = write!(out, "{description}\n\n");
        }
        let mut rows = Vec::new();
        walk(&schema, &schema, "", &mut rows);
        out.push_str("| key | type | default | description | example |\n");
        out.push_str("| --- | --- | --- | --- | --- |\n");
        for r in rows {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} |",
                r.key,
                cell(&r.kind),
                cell(&r.default),
                cell(&r.description),
                cell(&r.example)
            );
        }
        let _ = writeln!(out, "\n({file})");
    }
    out
}

/// Keys without a description (each should have a doc comment).
pub fn undocumented() -> Vec<String> {
    let mut missing = Vec::new();
    for (title, _, schema) in files() {
        let mut rows = Vec::new();
        walk(&schema, &schema, "", &mut rows);
        missing.extend(
            rows.into_iter()
                .filter(|r| r.description.is_empty())
                .map(|r| format!("{title}: {}", r.key)),
        );
    }
    missing
}

fn files() -> Vec<(&'static str, &'static str, Value)> {
    let json = |s: schemars::Schema| s.to_value();
    vec![
        (
            "emisar.toml (the server)",
            "src/server/config.rs: `ServerConfig`",
            json(schemars::schema_for!(ServerConfig)),
        ),
        (
            "runner.toml (a node's runner)",
            "src/node/config.rs: `RunnerConfig`",
            json(schemars::schema_for!(RunnerConfig)),
        ),
        (
            "The policy file",
            "src/server/policy/format.rs: `RawPolicy`",
            json(crate::server::policy::file_schema()),
        ),
    ]
}

/// Table cells are one line, and `|` would end the cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn text(schema: &Value, field: &str) -> String {
    schema
        .get(field)
        .and_then(Value::as_str)
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Follows a `$ref` into the root's `$defs`.
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => r
            .strip_prefix("#/$defs/")
            .and_then(|name| root["$defs"].get(name))
            .unwrap_or(schema),
        None => schema,
    }
}

/// The schema without its `null` alternative (an `Option`), resolved.
fn non_null<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            let rest: Vec<&Value> = options
                .iter()
                .filter(|o| o.get("type").and_then(Value::as_str) != Some("null"))
                .collect();
            if rest.len() == 1 && rest.len() < options.len() {
                return resolve(root, rest[0]);
            }
        }
    }
    resolve(root, schema)
}

/// A table of keys (an object with properties), as opposed to a map or a scalar.
fn is_table(schema: &Value) -> bool {
    schema.get("properties").is_some()
}

fn kind(root: &Value, schema: &Value) -> String {
    let s = non_null(root, schema);
    if let Some(values) = s.get("enum").and_then(Value::as_array) {
        return values
            .iter()
            .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(" or ");
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(options) = s.get(key).and_then(Value::as_array) {
            let consts: Vec<String> = options
                .iter()
                .filter_map(|o| o.get("const").and_then(Value::as_str))
                .map(|c| format!("`{c}`"))
                .collect();
            if consts.len() == options.len() {
                return consts.join(" or ");
            }
            return options
                .iter()
                .map(|o| kind(root, o))
                .collect::<Vec<_>>()
                .join(", or ");
        }
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect(),
        _ => vec![],
    };
    match types.first().copied() {
        Some("array") => format!("list of {}", kind(root, &s["items"])),
        Some("object") if is_table(s) => "table".into(),
        Some("object") => match s.get("additionalProperties") {
            Some(v) if v.is_object() => format!("table of {}", kind(root, v)),
            _ => "table".into(),
        },
        Some(t) => t.to_owned(),
        None => "any".into(),
    }
}

/// A value as it is written in TOML.
fn toml_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(toml_value).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(o) => format!(
            "{{ {} }}",
            o.iter()
                .map(|(k, v)| format!("{k} = {}", toml_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

/// The first "e.g. `…`" (or "E.g. `…`") in a description: the doc comment's own example.
fn example_in(description: &str) -> Option<String> {
    let at = description.replace("E.g. `", "e.g. `").find("e.g. `")? + "e.g. `".len();
    let end = description[at..].find('`')?;
    Some(description[at..at + end].to_owned())
}

fn walk(root: &Value, schema: &Value, prefix: &str, rows: &mut Vec<Row>) {
    let table = non_null(root, schema);
    let required: Vec<&str> = table
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = table.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, field) in properties {
        let key = format!("{prefix}{name}");
        let target = non_null(root, field);
        let mut description = text(field, "description");
        if description.is_empty() {
            description = text(target, "description");
        }
        let default = match field.get("default") {
            Some(Value::Null) | None if required.contains(&name.as_str()) => "*required*".into(),
            Some(Value::Null) | None => "*none*".into(),
            Some(v) => format!("`{}`", toml_value(v)),
        };
        let kind = kind(root, field);
        let empty = |v: &Value| {
            v.is_null()
                || v.as_array().is_some_and(Vec::is_empty)
                || v.as_object().is_some_and(|o| o.is_empty())
        };
        let example = match (example_in(&description), field.get("default")) {
            (Some(e), _) if e.starts_with('{') => format!("{name} = {e}"),
            // A line of a map (`vtysh = […]`): shown as the map it belongs to.
            (Some(e), _) if kind.starts_with("table of") && !e.starts_with('[') => {
                format!("{name} = {{ {e} }}")
            }
            (Some(e), _) if e.contains('=') || e.starts_with('[') => e,
            (Some(e), _) if kind == "string" => format!("{name} = \"{e}\""),
            (Some(e), _) if kind.starts_with("list of") => format!("{name} = [\"{e}\"]"),
            (Some(e), _) => format!("{name} = {e}"),
            (None, Some(v)) if !empty(v) => format!("{name} = {}", toml_value(v)),
            _ => sample(name, &key, &kind, target, root),
        };
        rows.push(Row {
            key: key.clone(),
            kind,
            default,
            description,
            example: format!("`{example}`"),
        });
        // Nested tables: their keys are documented under this one.
        if is_table(target) {
            walk(root, target, &format!("{key}."), rows);
        } else if target.get("type").and_then(Value::as_str) == Some("array") {
            let items = resolve(root, &target["items"]);
            if is_table(items) {
                walk(root, items, &format!("{key}[]."), rows);
            }
        } else if let Some(values) = target.get("additionalProperties")
            && is_table(resolve(root, values))
        {
            walk(root, resolve(root, values), &format!("{key}.NAME."), rows);
        }
    }
}

/// An example from the type alone, for a key whose doc comment and default give none. A
/// table is shown by its header, with its whole path (`[oidc]`, `[[runners]]`,
/// `[services.NAME]`), as it is written in the file.
fn sample(name: &str, key: &str, kind: &str, schema: &Value, root: &Value) -> String {
    let header = key.replace("[]", "");
    match kind {
        // No guessed file names or URLs: a key whose value has a shape worth showing says
        // so in its doc comment ("e.g. `…`").
        "string" if name.ends_with("_file") => format!("{name} = \"/etc/emisar/…\""),
        "string" if name.ends_with("_dir") => format!("{name} = \"/etc/emisar/…\""),
        "string" => format!("{name} = \"…\""),
        "boolean" => format!("{name} = true"),
        "integer" => format!("{name} = 10"),
        "list of table" => format!("[[{header}]]"),
        k if k.starts_with("list of") => format!("{name} = [\"…\"]"),
        "table of table" => format!("[{header}.NAME]"),
        k if k.starts_with("table of") => {
            let value = resolve(root, &schema["additionalProperties"]);
            format!("{name} = {{ KEY = {} }}", sample_value(value, root))
        }
        // One of several words: the first, quoted as TOML wants it.
        k if k.starts_with('`') && !k.contains(", or") => {
            format!("{name} = \"{}\"", k.split('`').nth(1).unwrap_or_default())
        }
        _ => format!("[{header}]"),
    }
}

/// A value of a map's value type, for `{ KEY = … }`.
fn sample_value(schema: &Value, root: &Value) -> String {
    let schema = non_null(root, schema);
    match kind(root, schema).as_str() {
        "integer" => "10".into(),
        "boolean" => "true".into(),
        k if k.starts_with("list of") => "[\"…\"]".into(),
        k if k.starts_with("table of") => format!(
            "{{ KEY = {} }}",
            sample_value(resolve(root, &schema["additionalProperties"]), root)
        ),
        k if k.starts_with('`') => format!("\"{}\"", k.split('`').nth(1).unwrap_or_default()),
        _ => "\"…\"".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_are_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
        let generated = generate();
        if std::env::var_os("EMISAR_WRITE_CONFIG_REFERENCE").is_some() {
            std::fs::write(path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/configuration.md differs from what the config structs generate; regenerate it with:\n  {REGENERATE}"
        );
    }

    /// Every example is TOML that gives its key a value of its type (`scopes = groups`, a
    /// quoted list, a list of strings for `[[runners]]` or `[token_auth_method]` for a word
    /// would not), a table's example is its header with its whole path, and no file or URL
    /// example is a guess made from the key's name.
    #[test]
    fn every_example_is_toml_of_the_keys_type() {
        let mut wrong = Vec::new();
        for (title, _, schema) in files() {
            let mut rows = Vec::new();
            walk(&schema, &schema, "", &mut rows);
            for r in rows {
                let example = r.example.trim_matches('`');
                let name = r.key.rsplit(['.', ']']).next().unwrap_or(&r.key);
                let want: fn(&toml::Value) -> bool = match r.kind.as_str() {
                    "string" => toml::Value::is_str,
                    "integer" => toml::Value::is_integer,
                    "boolean" => toml::Value::is_bool,
                    k if k.starts_with("list of") => toml::Value::is_array,
                    k if k.starts_with("table") => toml::Value::is_table,
                    k if k.starts_with('`') && !k.contains(", or") => toml::Value::is_str,
                    _ => continue,
                };
                let parsed = toml::from_str::<toml::Table>(example).ok();
                // A key's line (`name = …`), or a table's header with its whole path.
                let at_path = |t: &toml::Table| {
                    let mut parts = r.key.split('.').map(|p| p.trim_end_matches("[]"));
                    let mut v = t.get(parts.next()?)?;
                    for part in parts {
                        v = match v {
                            toml::Value::Array(a) => a.first()?.get(part)?,
                            other => other.get(part)?,
                        };
                    }
                    Some(v.clone())
                };
                let ok = parsed.as_ref().is_some_and(|t| {
                    t.get(name).is_some_and(want)
                        || at_path(t).is_some_and(|v| want(&v) || r.kind == "list of table")
                });
                let guessed = example.contains(&format!("/{name}.pem"))
                    || (name == "database_url" && !example.contains("postgres://"));
                if !ok || guessed {
                    wrong.push(format!("{title}: {} ({}): {example}", r.key, r.kind));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "examples that are not what they document: {wrong:#?}"
        );
    }

    #[test]
    fn every_key_has_a_description() {
        let missing = undocumented();
        assert!(
            missing.is_empty(),
            "these keys have no doc comment (the reference needs one): {missing:#?}"
        );
    }

    #[test]
    fn the_keys_operators_trip_on_are_there() {
        let doc = generate();
        for key in [
            "`exec_path`",
            "`allowlists`",
            "`labels`",
            "`advertise_url`",
            "`programs`",
            "`packs_dir`",
            "`max_output_bytes`",
            "`audit_key_file`",
            "`rate_limit_per_second`",
            "`rate_limit_burst`",
            "`health_probe_interval_ms`",
            "`health_probes_per_second`",
            "`login.per_address_per_minute`",
            "`runners[].tls_fingerprint`",
            "`services.NAME.base_url`",
            "`risk`",
        ] {
            assert!(doc.contains(&format!("| {key} |")), "{key} is missing");
        }
    }
}
