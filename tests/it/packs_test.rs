//! `emisar packs test`: the stock packs' cases cover every tool and pass through the runner's
//! engine; a wrong expectation, a broken template and a misspelt field each fail clearly.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use emisar::pack::PackSet;

fn packs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packs")
}

fn packs_test(dir: Option<&Path>) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_emisar"));
    cmd.args(["packs", "test"]);
    if let Some(dir) = dir {
        cmd.arg(dir);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run emisar packs test");
    (
        status.code().expect("exit code"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A packs dir holding one stock pack (optionally edited) and its cases (optionally edited).
fn edited(
    pack: &str,
    edit_pack: impl Fn(String) -> String,
    edit_cases: impl Fn(String) -> String,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tests")).unwrap();
    let text = std::fs::read_to_string(packs_dir().join(format!("{pack}.yaml"))).unwrap();
    std::fs::write(dir.path().join(format!("{pack}.yaml")), edit_pack(text)).unwrap();
    let cases = std::fs::read_to_string(packs_dir().join(format!("tests/{pack}.yaml"))).unwrap();
    std::fs::write(
        dir.path().join(format!("tests/{pack}.yaml")),
        edit_cases(cases),
    )
    .unwrap();
    dir
}

#[test]
fn every_stock_tool_has_a_case_and_all_pass() {
    let stock = PackSet::load(None).unwrap();
    for dir in [Some(packs_dir()), None] {
        let (code, out, err) = packs_test(dir.as_deref());
        assert_eq!(code, 0, "packs test {dir:?} failed:\n{out}\n{err}");
        assert!(!out.lines().any(|l| l.starts_with("FAIL ")), "{out}");
        for tool in stock.tools() {
            let passed = out
                .lines()
                .any(|l| l.starts_with("ok") && l.split_whitespace().nth(1) == Some(&tool.name));
            assert!(passed, "`{}` has no passing case:\n{out}", tool.name);
        }
        assert!(out.contains(", 0 without a case;"), "{out}");
    }
}

#[test]
fn a_wrong_expectation_fails_with_a_diff() {
    let dir = edited("consul", |p| p, |c| c.replacen("- v2", "- v3", 1));
    let (code, out, _) = packs_test(Some(dir.path()));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  consul.catalog_services"), "{out}");
    assert!(
        out.contains("output differs (- expected, + actual)"),
        "{out}"
    );
    let diff_line = |sign: char, text: &str| {
        out.lines()
            .any(|l| l.trim_start().starts_with(sign) && l.contains(text))
    };
    // The edit changed the recorded answer, so the expectation still says v2 and the engine's
    // output now says v3.
    assert!(diff_line('-', "\"v2\""), "{out}");
    assert!(diff_line('+', "\"v3\""), "{out}");
    assert!(out.contains("1 failed"), "{out}");
}

#[test]
fn a_broken_output_program_fails_its_case() {
    // The jq expression's field is misspelt: the shaped output loses the member's name.
    let dir = edited(
        "consul",
        |p| p.replace("{name: .Name, address:", "{name: .Nmae, address:"),
        |c| c,
    );
    let (code, out, _) = packs_test(Some(dir.path()));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  consul.members"), "{out}");
    assert!(out.contains("-    \"name\": \"srv-1\","), "{out}");
    assert!(out.contains("+    \"name\": null,"), "{out}");
}

#[test]
fn a_broken_template_fails_on_the_request_it_makes() {
    let dir = edited(
        "consul",
        |p| {
            p.replace(
                "path: /v1/health/service/{service}",
                "path: /v1/health/services/{service}",
            )
        },
        |c| c,
    );
    let (code, out, _) = packs_test(Some(dir.path()));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("request mismatch: the engine made GET /v1/health/services/web, the case recorded GET /v1/health/service/web"),
        "{out}"
    );
    // Said once per failed case: the step's failure that repeats it is not printed again.
    assert_eq!(
        out.matches("request mismatch").count(),
        out.matches("FAIL ").count(),
        "{out}"
    );
}

#[test]
fn a_misspelt_field_names_the_case_and_the_field() {
    let dir = edited(
        "consul",
        |p| p,
        |c| c.replacen("  tool: members", "  tol: members", 1),
    );
    let (code, out, err) = packs_test(Some(dir.path()));
    // A case file that does not load is a usage error (2), not a failed case (1).
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains("case `status codes become words, the role tag says server or client`"),
        "{err}"
    );
    assert!(err.contains("unknown field `tol`"), "{err}");
}

/// Every stock write's health gate has recorded cases both ways: one where it passes
/// (`verified: true`) and one where it fails (`error`), so a gate that always passes, or
/// never does, fails a case.
#[test]
fn every_stock_verify_has_a_passing_and_a_failing_case() {
    let stock = PackSet::load(None).unwrap();
    let mut verify_cases: Vec<(String, bool)> = Vec::new();
    for entry in std::fs::read_dir(packs_dir().join("tests")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let file: serde_json::Value = yaml_serde::from_str(&text).unwrap();
        let pack = file["pack"].as_str().unwrap();
        for case in file["cases"].as_array().unwrap() {
            if case["mode"] != "verify" {
                continue;
            }
            let tool = case["tool"].as_str().unwrap();
            let tool = if tool.contains('.') {
                tool.to_owned()
            } else {
                format!("{pack}.{tool}")
            };
            verify_cases.push((tool, case["expect"]["verified"] == true));
        }
    }
    let writes: Vec<_> = stock
        .tools()
        .filter(|t| t.risk != emisar::pack::Risk::Read)
        .collect();
    assert_eq!(writes.len(), 14, "the stock writes");
    for tool in writes {
        if tool.verify.is_none() {
            assert!(tool.no_verify.is_some(), "`{}`", tool.name);
            continue;
        }
        for passes in [true, false] {
            assert!(
                verify_cases.contains(&(tool.name.clone(), passes)),
                "`{}` has no verify case that {}",
                tool.name,
                if passes { "passes" } else { "fails" }
            );
        }
    }
}

/// A gate whose check was dropped lets a failed unit through: its failing case catches it.
#[test]
fn a_gate_that_stops_checking_fails_its_verify_case() {
    let dir = edited(
        "linux",
        |p| {
            p.replacen(
                "check: '.vars.active_state == \"active\"'",
                "check: 'true'",
                1,
            )
        },
        |c| c,
    );
    let (code, out, _) = packs_test(Some(dir.path()));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  linux.systemctl_restart          verify: a unit that failed after the restart fails the gate"),
        "{out}"
    );
    assert!(
        out.contains("expected an error containing \"precondition failed: unit `consul` is not active after the restart"),
        "{out}"
    );
}

/// A verify case expects the gate to pass (`verified: true`) or an error; anything else is
/// refused when the file loads, naming the case and the rule.
#[test]
fn a_verify_case_expects_a_pass_or_an_error() {
    let passing = "- name: 'verify: the unit is active after the restart'\n  tool: systemctl_restart\n  mode: verify\n";
    let refusals = [
        (
            passing.replace("  mode: verify\n", "  mode: verify\n  vars: {x: 1}\n"),
            "a verify sees the params alone, so a verify case has none",
        ),
        (
            "- name: a read has no gate\n  tool: unit_status\n  mode: verify\n  args: {unit: consul}\n  expect: {verified: true}\n".to_owned() + passing,
            "`mode: verify`: `linux.unit_status` has no verify",
        ),
    ];
    for (edit, rule) in refusals {
        let dir = edited("linux", |p| p, |c| c.replacen(passing, &edit, 1));
        let (code, out, err) = packs_test(Some(dir.path()));
        assert_eq!(code, 2, "{rule}: {out}");
        assert!(err.contains(rule), "{rule}: {err}");
    }
    let expectations = [
        ("verified: false", "`expect.verified`: write `true`"),
        (
            "output: {}",
            "`expect.output`: a verify has no shaped output",
        ),
        (
            "verified: true\n    error: x",
            "give `verified: true` or `error`, not both",
        ),
    ];
    for (expect, rule) in expectations {
        let dir = edited(
            "linux",
            |p| p,
            |c| {
                c.replacen(
                    "    verified: true\n    vars: {active_state: active, sub_state: running}",
                    &format!("    {expect}"),
                    1,
                )
            },
        );
        let (code, out, err) = packs_test(Some(dir.path()));
        assert_eq!(code, 2, "{rule}: {out}");
        assert!(
            err.contains("case `verify: the unit is active after the restart`")
                && err.contains(rule),
            "{rule}: {err}"
        );
    }
}
