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
