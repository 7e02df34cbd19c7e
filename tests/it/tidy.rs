//! The house rules that the compiler does not check by itself: the node and the server never
//! import each other (only the wire types in `protocol` cross), the shared building blocks
//! import neither, the top-level server modules import each other in no circle, every source file says
//! what it is for in a `//!` header, no product code allows `unsafe`, a module whose header
//! promises no IO (or no clock, no randomness, nothing async) names nothing that does it, and
//! only `node/exec.rs` (and the few files `PROCESS_STARTERS` names, each with its reason)
//! starts a process.
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

/// The module graph of `area` (`server`, `node`): each top-level module of `src/AREA/` (a
/// file `X.rs`, or a folder `X/` with every file under it) → the other top-level modules it
/// names, each with the first place (`file:line`) that names it. A module is named by
/// `crate::AREA::X…` (braced groups included) or by enough `super::` to climb out of its own
/// folder.
type ModuleGraph = BTreeMap<String, BTreeMap<String, String>>;

fn module_graph(area: &str) -> ModuleGraph {
    let root = src().join(area);
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
            for (at, module) in module_paths(&code, here.len(), area) {
                if module != *name && modules.contains_key(&module) {
                    let line = code[..at].matches('\n').count() + 1;
                    imports
                        .entry(module)
                        .or_insert_with(|| format!("src/{area}/{}:{line}", relative.display()));
                }
            }
        }
        graph.insert(name.clone(), imports);
    }
    graph
}

/// Every top-level module of `area` that `code` names, with the byte offset of the path: after
/// `crate::AREA::`, and after a chain of exactly `depth` `super::` in a file whose module
/// is `depth` deep under `area` (`server/tokens.rs` is 1 deep, `server/fleet/enrol.rs` 2), where it
/// climbs out of its own top-level module. `X::…` and `X;` give `X`, `{X, Y::z}` gives `X`
/// and `Y`. (An inline module's `super::` is read as its file's, which can only name the
/// file's own module: test modules reach back into their file, not beyond.)
fn module_paths(code: &str, depth: usize, area: &str) -> Vec<(usize, String)> {
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
    let named = format!("crate::{area}::");
    for (at, _) in code.match_indices(&named) {
        let rest = &code[at + named.len()..];
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
        module_paths(
            "use super::{db::Db, audit::kind};\nsuper::super::x::y",
            1,
            "server"
        ),
        vec![(4, "db".to_owned()), (4, "audit".to_owned())],
    );
    assert_eq!(
        module_paths("use super::super::tokens::Role; use super::x;", 2, "server"),
        vec![(4, "tokens".to_owned())],
    );
}

/// The circles of `graph`, each with the arrows that close it (`from → to (file:line)`).
fn circles_shown(graph: &ModuleGraph) -> Vec<String> {
    circles(graph)
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
        .collect()
}

#[test]
fn the_server_module_graph_has_no_circle() {
    let graph = module_graph("server");
    assert!(
        graph.get("http").is_some_and(|i| i.contains_key("gateway"))
            && graph.get("tokens").is_some_and(|i| i.contains_key("db")),
        "the module graph was not read: `http` should import `gateway` and `tokens` `db` \
         ({graph:?})"
    );
    let found = circles_shown(&graph);
    assert!(
        found.is_empty(),
        "the server's modules import each other in a circle (break one arrow of each: move \
         what both sides need into a module below them):\n{}",
        found.join("\n")
    );
}

/// The runner's modules form a tree (ARCHITECTURE.md, `src/node/mod.rs`): `agent` above
/// `grants`, both above `refusal`.
#[test]
fn the_node_module_graph_has_no_circle() {
    let graph = module_graph("node");
    assert!(
        graph.get("agent").is_some_and(|i| i.contains_key("grants"))
            && graph
                .get("grants")
                .is_some_and(|i| i.contains_key("refusal")),
        "the module graph was not read: `agent` should import `grants` and `grants` \
         `refusal` ({graph:?})"
    );
    let found = circles_shown(&graph);
    assert!(
        found.is_empty(),
        "the runner's modules import each other in a circle (break one arrow of each: move \
         what both sides need into a module below them, or hand it over as a parameter):\n{}",
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

/// What a module that promises "no IO" may not name: the store (`sqlx`, the server's `db`),
/// the async runtime (`tokio`: its files, sockets, timers and processes at once), HTTP,
/// files, sockets, processes and the environment. Address types (`std::net::IpAddr`) are
/// values, not IO, so sockets are named by their types.
const IO: &[&str] = &[
    "sqlx",
    "server::db",
    "super::db",
    "tokio",
    "reqwest",
    "hyper",
    "fs::",
    "File::",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "ToSocketAddrs",
    "std::process",
    "Command::new",
    "env::var",
    "env::args",
];
/// What a module that promises "no clock" may not name: any `now()`, and the wall clock.
const CLOCK: &[&str] = &["::now(", "SystemTime"];
/// What a module that promises "no randomness" may not name.
const RANDOMNESS: &[&str] = &["getrandom", "rand::", "rand_core", "OsRng", "thread_rng"];
/// What a module that promises "nothing async" may not name.
const ASYNC: &[&str] = &["async", ".await", "Future"];

/// A promise a header (or ARCHITECTURE.md) makes about what a module never does, and the
/// names that would break it.
struct Promise {
    /// The folder or file under src/ the promise covers.
    room: &'static str,
    /// Where the promise is written, and the words that make it (as prose: `//!` and line
    /// breaks do not count): if the words go, the rule must go with them (the test says so),
    /// so the header and the check stay one promise.
    said_in: &'static str,
    says: &'static str,
    forbidden: &'static [&'static [&'static str]],
}

const PROMISES: &[Promise] = &[
    Promise {
        room: "server/policy",
        said_in: "src/server/policy/mod.rs",
        says: "no IO except [`Policy::load`] reading the file; no clock, no randomness",
        forbidden: &[IO, CLOCK, RANDOMNESS],
    },
    Promise {
        room: "server/principal.rs",
        said_in: "src/server/principal.rs",
        says: "Invariant: pure; no SQL, no IO, no clock.",
        forbidden: &[IO, CLOCK],
    },
    Promise {
        room: "server/approvals/state.rs",
        said_in: "src/server/approvals/state.rs",
        says: "No IO, no clock but the `now` it is given",
        forbidden: &[IO, CLOCK],
    },
    Promise {
        room: "server/audit/chain.rs",
        said_in: "src/server/audit/chain.rs",
        says: "Pure: no IO.",
        forbidden: &[IO],
    },
    Promise {
        room: "server/audit/signed.rs",
        said_in: "src/server/audit/signed.rs",
        says: "Pure: the caller reads the events",
        forbidden: &[IO],
    },
    Promise {
        room: "server/runners/breaker.rs",
        said_in: "src/server/runners/breaker.rs",
        says: "the breaker itself never reads a clock",
        forbidden: &[CLOCK],
    },
    Promise {
        room: "tlog",
        said_in: "src/tlog/mod.rs",
        says: "no IO, nothing async",
        forbidden: &[IO, ASYNC],
    },
    Promise {
        room: "protocol/approval",
        said_in: "ARCHITECTURE.md",
        says: "`protocol/approval/`: pure, no IO",
        forbidden: &[IO],
    },
    Promise {
        room: "protocol/audit_event.rs",
        said_in: "src/protocol/audit_event.rs",
        says: "Pure.",
        forbidden: &[IO],
    },
    Promise {
        room: "digest.rs",
        said_in: "ARCHITECTURE.md",
        says: "`digest.rs`, `selector.rs` and `tlog/` are pure",
        forbidden: &[IO, CLOCK, RANDOMNESS],
    },
    Promise {
        room: "selector.rs",
        said_in: "ARCHITECTURE.md",
        says: "`digest.rs`, `selector.rs` and `tlog/` are pure",
        forbidden: &[IO, CLOCK, RANDOMNESS],
    },
];

/// The places a promise knowingly leaves, each with why; a line is excused when its file ends
/// with the path and the line holds the text.
const PROMISES_EXCUSED: &[(&str, &str, &str)] = &[(
    "src/server/policy/checks.rs",
    "std::fs::read_to_string(path)",
    "`Policy::load` reads the policy file: the one IO the policy's header names",
)];

/// The files that may start a process (`Command::new`), each with why. The test harness under
/// tests/ starts the real peers (PostgreSQL, FRR, Traefik, the binaries themselves) and is
/// not product code, so it is not read; nor are test modules in src/.
const PROCESS_STARTERS: &[(&str, &str)] = &[
    (
        "src/node/exec.rs",
        "the runner's one door to processes: argv only, cleared env, own process group, timeout",
    ),
    (
        "src/lab/vm.rs",
        "`emisar lab` runs a real VictoriaMetrics and a watchdog shell that stops it if the lab \
         dies; the lab is a demo behind its own feature, never in the package",
    ),
];

/// The words that start a process, or bring the type that does into scope under any name.
const PROCESS: &[&str] = &[
    "Command::new",
    "process::Command",
    "Command as",
    "posix_spawn",
    "fork(",
];

/// `text` as prose: comment markers gone, every run of white space one space.
fn prose(text: &str) -> String {
    text.split_whitespace()
        .filter(|w| !matches!(*w, "//!" | "///" | "//"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `code` names `word`: as a whole path segment at its start when it begins with a
/// letter (so `fs::` is found in `std::fs::read` but not in `refs::`).
fn names(code: &str, word: &str) -> bool {
    let starts_a_name = word.starts_with(|c: char| c.is_alphanumeric() || c == '_');
    code.match_indices(word).any(|(at, _)| {
        !starts_a_name
            || !code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// The product lines of a source file, numbered from 1, comments cut: every line but those of
/// an inline `#[cfg(test)] mod … { … }`, whose end is found by counting braces.
fn product_lines(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut product = Vec::new();
    let mut test_depth: Option<i64> = None;
    for (n, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if let Some(depth) = test_depth.as_mut() {
            *depth += code.matches('{').count() as i64 - code.matches('}').count() as i64;
            if *depth <= 0 {
                test_depth = None;
            }
            continue;
        }
        let next = lines.get(n + 1).map(|l| l.trim()).unwrap_or("");
        if line.trim() == "#[cfg(test)]" && next.starts_with("mod ") && next.ends_with('{') {
            test_depth = Some(0);
            continue;
        }
        product.push((n + 1, code));
    }
    product
}

/// The files that only tests compile: those declared `#[cfg(test)] mod name;` (the file
/// `name.rs` next to a `mod.rs`, or under the declaring file's own folder).
fn test_only_files(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            let Some(name) = pair[1]
                .strip_prefix("mod ")
                .and_then(|rest| rest.strip_suffix(';'))
            else {
                continue;
            };
            if pair[0] != "#[cfg(test)]" {
                continue;
            }
            let folder = if file
                .file_name()
                .is_some_and(|f| f == "mod.rs" || f == "lib.rs")
            {
                file.parent().unwrap().to_path_buf()
            } else {
                file.with_extension("")
            };
            found.push(folder.join(format!("{name}.rs")));
            found.push(folder.join(name).join("mod.rs"));
        }
    }
    found
}

/// The product files under `room` (a folder or a file of src/).
fn product_files(room: &str) -> Vec<PathBuf> {
    let path = if room == "." { src() } else { src().join(room) };
    let mut files = Vec::new();
    if path.is_dir() {
        rust_files(&path, &mut files);
    } else {
        files.push(path);
    }
    let mut everything = Vec::new();
    rust_files(&src(), &mut everything);
    let tests = test_only_files(&everything);
    files.retain(|f| !tests.contains(f));
    files
}

/// `file:line: the line (names `word`)` for every product line under `room` that names one
/// of `forbidden`, unless `excused` holds its file and text.
fn breaches(room: &str, forbidden: &[&str], excused: &[(&str, &str, &str)]) -> Vec<String> {
    let mut found = Vec::new();
    for file in product_files(room) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, code) in product_lines(&text) {
            let Some(word) = forbidden.iter().find(|w| names(code, w)) else {
                continue;
            };
            let shown = file.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap();
            if excused
                .iter()
                .any(|(path, text, _)| shown.ends_with(path) && code.contains(text))
            {
                continue;
            }
            found.push(format!(
                "{}:{n}: {} (names `{word}`)",
                shown.display(),
                code.trim()
            ));
        }
    }
    found
}

#[test]
fn the_promise_checks_find_what_they_look_for() {
    assert!(names("use std::fs::read;", "fs::"));
    assert!(!names("let refs::x = 1;", "fs::"));
    assert!(names("use tokio_util::sync;", "tokio"));
    assert!(!names("let my_tokio = 1;", "tokio"));
    assert!(names("let t = Instant::now();", "::now("));
    assert!(names("x.await", ".await"));
    let text = "use a;\n// tokio in a comment\nfn f() {} // sqlx\n#[cfg(test)]\nmod tests {\n  \
                fn g() { tokio(); }\n}\nuse sqlx;";
    let product: Vec<&str> = product_lines(text).into_iter().map(|(_, l)| l).collect();
    assert_eq!(product, ["use a;", "", "fn f() {} ", "use sqlx;"]);
    assert_eq!(prose("//! No IO, no\n//! clock."), "No IO, no clock.");
    // The rooms are read: the policy has files, and its one excused read is there to excuse.
    assert!(product_files("server/policy").len() > 3);
    assert_eq!(breaches("server/policy", IO, &[]).len(), 1);
    assert!(
        !product_files("server/policy")
            .iter()
            .any(|f| f.ends_with("policy/testing.rs")),
        "`policy/testing.rs` is compiled for tests only"
    );
}

/// "policy does no IO", "`state.rs` is pure", "tlog is pure": each such header promise is a
/// rule here, and the module breaks the rule if it names what the promise rules out.
#[test]
fn modules_that_promise_purity_name_no_io() {
    let mut problems = Vec::new();
    for promise in PROMISES {
        let said =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(promise.said_in))
                .unwrap();
        if !prose(&said).contains(promise.says) {
            problems.push(format!(
                "{} no longer says {:?}: if `{}` no longer promises it, drop its rule from \
                 PROMISES here",
                promise.said_in, promise.says, promise.room
            ));
        }
        let forbidden: Vec<&str> = promise.forbidden.concat();
        for breach in breaches(promise.room, &forbidden, PROMISES_EXCUSED) {
            problems.push(format!(
                "{breach}: `{}` promises {:?} ({})",
                promise.room, promise.says, promise.said_in
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "a module breaks the promise its header makes (move the IO to the caller, or change the \
         promise and this rule together):\n{}",
        problems.join("\n")
    );
}

/// Only `node/exec.rs` starts processes (and the few places PROCESS_STARTERS names, each with
/// its reason).
#[test]
fn only_the_allowed_files_start_processes() {
    let allowed: Vec<(&str, &str, &str)> = PROCESS_STARTERS
        .iter()
        .map(|(file, why)| (*file, "", *why))
        .collect();
    let found = breaches(".", PROCESS, &allowed);
    assert!(
        found.is_empty(),
        "only src/node/exec.rs starts processes (go through it, or add the file to \
         PROCESS_STARTERS with its reason):\n{}",
        found.join("\n")
    );
    for (file, _) in PROCESS_STARTERS {
        let text =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        assert!(
            product_lines(&text)
                .iter()
                .any(|(_, l)| names(l, "Command::new")),
            "{file} starts no process any more: drop it from PROCESS_STARTERS"
        );
    }
}
