//! The alert rules emisar ships (deploy/prometheus/emisar-rules.yml) hold up: Prometheus's own
//! promtool accepts them and passes their unit tests, every alert says how long, how bad, what
//! it means and where its runbook is (a section that exists), every alert has a unit test that
//! makes it fire and one that keeps it quiet, and every series the rules read is one the server
//! exports, so a renamed metric breaks this test rather than silently the alert.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use yaml_serde::Value;

/// Debian's `prometheus` package installs it (scripts/install-test-deps does).
const PROMTOOL: &str = "/usr/bin/promtool";
/// Debian's `victoria-metrics` package installs it.
const VMALERT: &str = "/usr/bin/vmalert";

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn rules_file() -> PathBuf {
    repo().join("deploy/prometheus/emisar-rules.yml")
}

fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every alerting rule of the file, in order.
pub fn alerts(rules: &Value) -> Vec<Value> {
    rules["groups"]
        .as_sequence()
        .expect("`groups` is a list")
        .iter()
        .flat_map(|g| {
            g["rules"]
                .as_sequence()
                .expect("a group has `rules`")
                .clone()
        })
        .filter(|r| r.get("alert").is_some())
        .collect()
}

fn text(v: &Value, what: &str) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
        .to_owned()
}

/// promtool ARGS, from deploy/prometheus: whether it succeeded, and what it printed.
fn promtool(args: &[&str]) -> (bool, String) {
    assert!(
        Path::new(PROMTOOL).exists(),
        "{PROMTOOL} is missing: run scripts/install-test-deps (Debian package `prometheus`)"
    );
    let out = Command::new(PROMTOOL)
        .args(args)
        .current_dir(repo().join("deploy/prometheus"))
        .output()
        .expect("promtool runs");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let (ok, printed) = promtool(&["check", "rules", "emisar-rules.yml"]);
    assert!(ok, "promtool check rules:\n{printed}");
    let count = alerts(&read_yaml(&rules_file())).len();
    assert!(
        printed.contains(&format!("SUCCESS: {count} rules found")),
        "{printed}"
    );
    let (ok, printed) = promtool(&["test", "rules", "emisar-rules.test.yml"]);
    assert!(ok, "promtool test rules:\n{printed}");
}

/// The shipped Prometheus configuration loads: its scrape of emisar with the auditor token
/// file and the server's CA, and the rules file beside it. promtool reads it where an operator would put it, with
/// the token file there.
#[test]
fn promtool_accepts_the_shipped_prometheus_config() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("emisar.token");
    std::fs::write(&token, "emisar_at_example\n").unwrap();
    // The private CA of the server's certificate, which the config names.
    let ca = crate::harness::certs::self_signed(dir.path(), "emisar-ca");
    let config = std::fs::read_to_string(repo().join("deploy/prometheus/prometheus.yml"))
        .unwrap()
        .replace("/etc/prometheus/emisar.token", token.to_str().unwrap())
        .replace("/etc/prometheus/emisar-ca.crt", ca.cert.to_str().unwrap());
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    std::fs::copy(rules_file(), dir.path().join("emisar-rules.yml")).unwrap();
    let config = dir.path().join("prometheus.yml");
    let (ok, printed) = promtool(&["check", "config", config.to_str().unwrap()]);
    assert!(ok, "promtool check config:\n{printed}");
    assert!(printed.contains("SUCCESS: 1 rule files found"), "{printed}");
}

/// vmalert (VictoriaMetrics' evaluator, whose MetricsQL differs from PromQL in places) loads
/// the same file.
#[test]
fn vmalert_accepts_the_rules() {
    let vmalert = Path::new(VMALERT);
    assert!(
        vmalert.exists(),
        "vmalert is missing: run scripts/install-test-deps (Debian package victoria-metrics)"
    );
    let out = Command::new(vmalert)
        .arg("-dryRun")
        .arg(format!("-rule={}", rules_file().display()))
        .output()
        .expect("vmalert runs");
    assert!(
        out.status.success(),
        "vmalert -dryRun:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `duration` (a Prometheus duration such as `5m`) is longer than nothing.
fn lasts(duration: &str) -> bool {
    let digits: String = duration.chars().take_while(char::is_ascii_digit).collect();
    digits.parse::<u64>().is_ok_and(|n| n > 0)
}

/// The anchors GitHub and most renderers give the headings of `markdown`: lowercase, spaces
/// to `-`, other punctuation dropped.
fn heading_anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn every_alert_says_how_long_how_bad_what_it_means_and_where_to_read_more() {
    let guide = std::fs::read_to_string(repo().join("docs/operator-guide.md")).unwrap();
    let anchors = heading_anchors(&guide);
    let alerts = alerts(&read_yaml(&rules_file()));
    assert!(!alerts.is_empty());
    for rule in &alerts {
        let name = text(&rule["alert"], "alert");
        let wait = rule.get("for").map(|f| text(f, "for")).unwrap_or_default();
        assert!(lasts(&wait), "{name}: `for:` must be a wait, not `{wait}`");
        let severity = text(&rule["labels"]["severity"], "labels.severity");
        assert!(
            ["critical", "warning"].contains(&severity.as_str()),
            "{name}: severity `{severity}` is neither critical nor warning"
        );
        for key in ["summary", "description"] {
            let said = text(&rule["annotations"][key], key);
            assert!(
                said.len() > 20,
                "{name}: annotation `{key}` says too little"
            );
        }
        let description = text(&rule["annotations"]["description"], "description");
        assert!(
            description.contains("First check"),
            "{name}: the description must say what to check first"
        );
        let runbook = text(&rule["annotations"]["runbook"], "runbook");
        let anchor = runbook
            .strip_prefix("docs/operator-guide.md#")
            .unwrap_or_else(|| panic!("{name}: runbook `{runbook}` is not in the operator guide"));
        assert!(
            anchors.contains(anchor),
            "{name}: docs/operator-guide.md has no heading for `#{anchor}`"
        );
        assert_eq!(
            anchor,
            name.to_lowercase(),
            "{name}: its section is named after it"
        );
    }
}

#[test]
fn every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() {
    let names: BTreeSet<String> = alerts(&read_yaml(&rules_file()))
        .iter()
        .map(|r| text(&r["alert"], "alert"))
        .collect();
    let tests = read_yaml(&repo().join("deploy/prometheus/emisar-rules.test.yml"));
    let (mut fired, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for test in tests["tests"].as_sequence().expect("`tests` is a list") {
        for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = text(&case["alertname"], "alertname");
            let expected = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
            if expected > 0 {
                fired.insert(name);
            } else {
                quiet.insert(name);
            }
        }
    }
    let unfired: Vec<_> = names.difference(&fired).collect();
    let never_quiet: Vec<_> = names.difference(&quiet).collect();
    assert!(unfired.is_empty(), "no unit test fires {unfired:?}");
    assert!(
        never_quiet.is_empty(),
        "no unit test keeps {never_quiet:?} quiet"
    );
    let unknown: Vec<_> = fired
        .union(&quiet)
        .filter(|n| !names.contains(*n))
        .collect();
    assert!(
        unknown.is_empty(),
        "unit tests of alerts that do not exist: {unknown:?}"
    );
}

/// The `emisar_…` series names an expression reads.
pub fn series_in(expr: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("emisar_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        found.insert(name);
    }
    found
}

/// The series names src/server/metrics.rs writes: those in its code, not in its comments.
fn exported_series() -> BTreeSet<String> {
    let source = std::fs::read_to_string(repo().join("src/server/metrics.rs")).unwrap();
    source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .flat_map(series_in)
        .collect()
}

#[test]
fn the_rules_read_only_series_the_server_exports() {
    let exported = exported_series();
    let mut read = BTreeSet::new();
    for rule in alerts(&read_yaml(&rules_file())) {
        read.extend(series_in(&text(&rule["expr"], "expr")));
    }
    assert!(read.len() >= 10, "{read:?}");
    let missing: Vec<_> = read.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the rules read series src/server/metrics.rs does not export: {missing:?}"
    );
}
