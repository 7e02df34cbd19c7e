//! The house rules that the compiler does not check by itself: the node and the server never
//! import each other (only the wire types in `protocol` cross), the shared building blocks
//! import neither, every source file says what it is for in a `//!` header, and no product
//! code allows `unsafe`.
//!
//! The `emisar-runner` build (`--no-default-features`, which has no `server` module) makes the
//! compiler enforce the node's half; these checks cover the server's half and the shared blocks.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Files under `room` (a folder or a file of src/) that name any of `forbidden`.
fn offenders(room: &str, forbidden: &[&str]) -> Vec<String> {
    let path = src().join(room);
    let mut files = Vec::new();
    if path.is_dir() {
        rust_files(&path, &mut files);
    } else {
        files.push(path);
    }
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for f in forbidden {
                if code.contains(f) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    found
}

const COMPOSITION: [&str; 4] = [
    "crate::cli",
    "crate::dev",
    "crate::stdio_bridge",
    "crate::lab",
];

#[test]
fn the_node_imports_nothing_of_the_server() {
    let mut forbidden = vec!["crate::server"];
    forbidden.extend(COMPOSITION);
    let found = offenders("node", &forbidden);
    assert!(
        found.is_empty(),
        "node code reaches into the server:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_server_imports_nothing_of_the_node() {
    let mut forbidden = vec!["crate::node"];
    forbidden.extend(COMPOSITION);
    let found = offenders("server", &forbidden);
    assert!(
        found.is_empty(),
        "server code reaches into the node:\n{}",
        found.join("\n")
    );
}

#[test]
fn shared_blocks_import_neither_side() {
    let mut forbidden = vec!["crate::server", "crate::node"];
    forbidden.extend(COMPOSITION);
    for room in ["protocol", "pack", "util", "digest.rs", "selector.rs"] {
        let found = offenders(room, &forbidden);
        assert!(
            found.is_empty(),
            "`{room}` is shared and must stay so:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn every_source_file_says_what_it_is_for() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let undocumented: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            !text.trim_start().starts_with("//!")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        undocumented.is_empty(),
        "these files have no `//!` header saying what they are for:\n{}",
        undocumented.join("\n")
    );
}

#[test]
fn no_product_code_allows_unsafe() {
    let found = offenders(".", &["unsafe_code", "unsafe {", "unsafe fn"]);
    assert!(found.is_empty(), "unsafe code in the product: {found:?}");
}
