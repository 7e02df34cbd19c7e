//! The house rules that the compiler does not check by itself: the node and the server never
//! import each other (only the wire types in `protocol` cross), the shared building blocks
//! import neither, the top-level server modules import each other in no circle, every source file says
//! what it is for in a `//!` header, and no product code allows `unsafe`.
//!
//! The `emisar-runner` build (`--no-default-features`, which has no `server` module) makes the
//! compiler enforce the node's half; these checks cover the server's half and the shared blocks.

use std::collections::BTreeMap;
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
    for room in [
        "protocol",
        "pack",
        "util",
        "tlog",
        "witness",
        "digest.rs",
        "selector.rs",
    ] {
        let found = offenders(room, &forbidden);
        assert!(
            found.is_empty(),
            "`{room}` is shared and must stay so:\n{}",
            found.join("\n")
        );
    }
}

/// The server's module graph: each top-level module of `src/server/` (a file `X.rs`, or a
/// folder `X/` with every file under it) → the other top-level modules it names, each with the
/// first place (`file:line`) that names it. A module is named by `crate::server::X…` (braced
/// groups included) or by enough `super::` to climb out of its own folder.
type ModuleGraph = BTreeMap<String, BTreeMap<String, String>>;

fn server_module_graph() -> ModuleGraph {
    let root = src().join("server");
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else if path.extension().is_some_and(|e| e == "rs") && name != "mod" {
            files.push(path);
        } else {
            continue;
        }
        modules.insert(name, files);
    }
    let mut graph = ModuleGraph::new();
    for (name, files) in &modules {
        let mut imports = BTreeMap::new();
        for file in files {
            let relative = file.strip_prefix(&root).unwrap();
            // `fleet/enrol.rs` is the module `fleet::enrol`, `fleet/mod.rs` is `fleet`.
            let mut here: Vec<String> = relative
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if here.last().is_some_and(|last| last == "mod") {
                here.pop();
            }
            let text = std::fs::read_to_string(file).unwrap();
            // Comments may name modules without importing them; a braced group may span lines.
            let code: String = text
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            for (at, module) in server_paths(&code, here.len()) {
                if module != *name && modules.contains_key(&module) {
                    let line = code[..at].matches('\n').count() + 1;
                    imports
                        .entry(module)
                        .or_insert_with(|| format!("src/server/{}:{line}", relative.display()));
                }
            }
        }
        graph.insert(name.clone(), imports);
    }
    graph
}

/// Every top-level server module `code` names, with the byte offset of the path: after
/// `crate::server::`, and after a chain of exactly `depth` `super::` in a file whose module
/// is `depth` deep under `server` (`tokens.rs` is 1 deep, `fleet/enrol.rs` 2), where it
/// climbs out of its own top-level module. `X::…` and `X;` give `X`, `{X, Y::z}` gives `X`
/// and `Y`. (An inline module's `super::` is read as its file's, which can only name the
/// file's own module: test modules reach back into their file, not beyond.)
fn server_paths(code: &str, depth: usize) -> Vec<(usize, String)> {
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let heads = |rest: &str| -> Vec<String> {
        let Some(group) = rest.strip_prefix('{') else {
            return vec![ident(rest)];
        };
        let mut found = Vec::new();
        let mut depth = 0;
        let mut item = String::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    found.push(ident(&item));
                    item.clear();
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        found.push(ident(&item));
        found
    };
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::server::") {
        let rest = &code[at + "crate::server::".len()..];
        found.extend(heads(rest).into_iter().map(|m| (at, m)));
    }
    for (at, _) in code.match_indices("super::") {
        let before = &code[..at];
        if before.ends_with("super::")
            || before.ends_with(|c: char| c.is_alphanumeric() || c == '_')
        {
            continue; // not the start of a chain
        }
        let mut rest = &code[at..];
        let mut climbed = 0;
        while let Some(after) = rest.strip_prefix("super::") {
            rest = after;
            climbed += 1;
        }
        if climbed == depth {
            found.extend(heads(rest).into_iter().map(|m| (at, m)));
        }
    }
    found.retain(|(_, m)| !m.is_empty());
    found
}

/// The strongly connected components of `graph` that hold more than one module: each is a
/// circle of imports, every module in it reachable from every other. Tarjan's algorithm,
/// written out because it is thirty lines and no graph crate is among the dependencies.
fn circles(graph: &ModuleGraph) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g ModuleGraph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(walk: &mut Walk<'g>, module: &'g str) {
        let index = walk.index.len();
        walk.index.insert(module, index);
        walk.low.insert(module, index);
        walk.stack.push(module);
        for next in walk.graph[module].keys() {
            let next = next.as_str();
            if !walk.index.contains_key(next) {
                visit(walk, next);
                let low = walk.low[module].min(walk.low[next]);
                walk.low.insert(module, low);
            } else if walk.stack.contains(&next) {
                let low = walk.low[module].min(walk.index[next]);
                walk.low.insert(module, low);
            }
        }
        if walk.low[module] == index {
            let at = walk.stack.iter().rposition(|m| *m == module).unwrap();
            let mut component: Vec<String> = walk.stack.drain(at..).map(str::to_owned).collect();
            if component.len() > 1 {
                component.sort();
                walk.found.push(component);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for module in graph.keys() {
        if !walk.index.contains_key(module.as_str()) {
            visit(&mut walk, module);
        }
    }
    walk.found
}

#[test]
fn circles_are_found_whole() {
    let graph = |edges: &[(&str, &str)]| {
        let mut graph = ModuleGraph::new();
        for (from, to) in edges {
            graph.entry(to.to_string()).or_default();
            graph
                .entry(from.to_string())
                .or_default()
                .insert(to.to_string(), String::new());
        }
        graph
    };
    // No pair imports each other, yet a → b → c → a is one circle; d hangs off it.
    let found = circles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]));
    assert_eq!(found, vec![vec!["a", "b", "c"]]);
    let found = circles(&graph(&[
        ("a", "b"),
        ("b", "a"),
        ("c", "d"),
        ("d", "e"),
        ("e", "c"),
    ]));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(circles(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
    assert_eq!(
        server_paths("use super::{db::Db, audit::kind};\nsuper::super::x::y", 1),
        vec![(4, "db".to_owned()), (4, "audit".to_owned())],
    );
    assert_eq!(
        server_paths("use super::super::tokens::Role; use super::x;", 2),
        vec![(4, "tokens".to_owned())],
    );
}

#[test]
fn the_server_module_graph_has_no_circle() {
    let graph = server_module_graph();
    assert!(
        graph.get("http").is_some_and(|i| i.contains_key("gateway"))
            && graph.get("tokens").is_some_and(|i| i.contains_key("db")),
        "the module graph was not read: `http` should import `gateway` and `tokens` `db` \
         ({graph:?})"
    );
    let found: Vec<String> = circles(&graph)
        .iter()
        .map(|circle| {
            let mut text = format!("circle of {} modules: {}", circle.len(), circle.join(", "));
            for from in circle {
                for (to, place) in &graph[from] {
                    if circle.contains(to) {
                        text.push_str(&format!("\n  {from} → {to} ({place})"));
                    }
                }
            }
            text
        })
        .collect();
    assert!(
        found.is_empty(),
        "the server's modules import each other in a circle (break one arrow of each: move \
         what both sides need into a module below them):\n{}",
        found.join("\n")
    );
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
