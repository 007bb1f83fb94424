//! The hub's shape, checked by reading its sources (no build of the hub's code is exercised):
//! `crate::…` and `super::…` paths in `src/**/*.rs` give the arrows between the top-level
//! modules and folders; the test fails, naming the files, on
//!
//! - an arrow from a lower layer to a higher one ([`LAYERS`], the same table as the README's);
//! - an import circle between top-level modules (two modules of one layer importing each other
//!   is a circle too);
//! - a non-test file with more than [`MAX_LINES`] lines before its first `#[cfg(test)]`
//!   (tests go in a `tests.rs` child module).
//!
//! `cargo test -p lifeboat-hub --test structure -- --nocapture` (or `make structure`) prints
//! the drawing: the layers, top to bottom, and every arrow with its number of import sites.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The layers, top to bottom: a module may import from its own folder and from lower layers.
const LAYERS: &[(&str, &[&str])] = &[
    ("wiring", &["main", "process"]),
    ("request edges", &["admission", "agentapi"]),
    ("binding", &["binding"]),
    ("failover", &["failover"]),
    ("status", &["status"]),
    ("clusters", &["clusters"]),
    ("interpreters", &["interpreters"]),
    ("work", &["work"]),
    ("ledger", &["ledger"]),
    ("shared", &["leadership", "test_metrics"]),
];

/// The most lines a non-test file may have before its first `#[cfg(test)]`.
const MAX_LINES: usize = 600;

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// One source file: its module path (`["status", "processor"]`), its text.
struct Source {
    relative: String,
    module: Vec<String>,
    text: String,
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<Source>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, root, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path
            .strip_prefix(root)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        let mut module: Vec<String> = relative
            .trim_end_matches(".rs")
            .split('/')
            .map(str::to_string)
            .collect();
        if matches!(
            module.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) && module.len() > 1
        {
            module.pop();
        } else if module == ["lib"] {
            module.clear();
        }
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        out.push(Source {
            relative,
            module,
            text,
        });
    }
}

/// The top-level module each `crate::` / `super::` path of `source` names, with its line.
fn imports(source: &Source) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut in_tests = false;
    for (index, line) in source.text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if line.trim_start().starts_with("#[cfg(test)]") {
            in_tests = true;
        }
        for (at, _) in code.match_indices("crate::") {
            let before = code[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // `lifeboat_hub_crate::`, not ours
            }
            let rest = &code[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((name, index + 1));
            }
        }
        for (at, _) in code.match_indices("super::") {
            let before = code[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // the second `super` of `super::super::`, counted below
            }
            // An inline `mod tests` after `#[cfg(test)]` is one level below the file's module.
            let mut module = source.module.clone();
            if in_tests {
                module.push("tests".into());
            }
            let mut rest = &code[at..];
            while let Some(after) = rest.strip_prefix("super::") {
                module.pop();
                rest = after;
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let top = module.first().cloned().unwrap_or(name);
            if !top.is_empty() && top != "self" {
                found.push((top, index + 1));
            }
        }
    }
    found
}

/// Lines before the first `#[cfg(test)]`.
fn lines_of_code(text: &str) -> usize {
    text.lines()
        .take_while(|line| !line.trim_start().starts_with("#[cfg(test)]"))
        .count()
}

/// Arrows between top-level modules: (from, to) → the import sites (`file:line`).
type Arrows = BTreeMap<(String, String), Vec<String>>;

fn arrows(sources: &[Source]) -> Arrows {
    let mut arrows = Arrows::new();
    for source in sources {
        let Some(from) = source.module.first() else {
            continue; // lib.rs only declares the modules
        };
        for (to, line) in imports(source) {
            if &to != from {
                arrows
                    .entry((from.clone(), to))
                    .or_default()
                    .push(format!("src/{}:{line}", source.relative));
            }
        }
    }
    arrows
}

/// Every problem with the arrows: upward arrows, arrows within a layer, unknown modules,
/// circles.
fn arrow_problems(arrows: &Arrows) -> Vec<String> {
    let mut problems = Vec::new();
    for ((from, to), sites) in arrows {
        match (layer_of(from), layer_of(to)) {
            (None, _) => problems.push(format!(
                "module `{from}` is in no layer of LAYERS (tests/structure.rs and the README): {}",
                sites.join(", ")
            )),
            (_, None) => problems.push(format!(
                "module `{to}` is in no layer of LAYERS (tests/structure.rs and the README): {}",
                sites.join(", ")
            )),
            (Some(a), Some(b)) if a > b => problems.push(format!(
                "upward import: `{from}` ({}) imports `{to}` ({}), a higher layer: {}",
                LAYERS[a].0,
                LAYERS[b].0,
                sites.join(", ")
            )),
            _ => {}
        }
    }
    for cycle in circles(arrows) {
        let sites: Vec<String> = cycle
            .windows(2)
            .flat_map(|pair| arrows[&(pair[0].clone(), pair[1].clone())].clone())
            .collect();
        problems.push(format!(
            "import circle {}: {}",
            cycle.join(" -> "),
            sites.join(", ")
        ));
    }
    problems
}

/// One circle through each strongly connected set of modules (as `a -> b -> a`).
fn circles(arrows: &Arrows) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in arrows.keys() {
        next.entry(from).or_default().insert(to);
    }
    let mut seen_in_circle: BTreeSet<String> = BTreeSet::new();
    let mut found = Vec::new();
    for start in next.keys() {
        if seen_in_circle.contains(*start) {
            continue;
        }
        // Breadth-first from `start`, back to `start`: the shortest circle through it.
        let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([*start]);
        let mut closed_by = None;
        'search: while let Some(at) = queue.pop_front() {
            for to in next.get(at).into_iter().flatten() {
                if to == start {
                    closed_by = Some(at);
                    break 'search;
                }
                if !parent.contains_key(to) {
                    parent.insert(to, at);
                    queue.push_back(to);
                }
            }
        }
        if let Some(mut at) = closed_by {
            // `at` closes the circle; its parents lead back to `start`.
            let mut back = vec![at.to_string()];
            while at != *start {
                at = parent[at];
                back.push(at.to_string());
            }
            back.reverse(); // start -> ... -> the closing module
            let mut cycle = back;
            cycle.push(start.to_string());
            seen_in_circle.extend(cycle.iter().cloned());
            found.push(cycle);
        }
    }
    found
}

/// The drawing: layers top to bottom, each module with its arrows; then the same as DOT.
fn drawing(arrows: &Arrows) -> String {
    let mut text = String::new();
    for (layer, modules) in LAYERS {
        let _ = writeln!(text, "[{layer}]");
        for module in *modules {
            let out: Vec<String> = arrows
                .iter()
                .filter(|((from, _), _)| from == module)
                .map(|((_, to), sites)| format!("{to} ({})", sites.len()))
                .collect();
            if out.is_empty() {
                let _ = writeln!(text, "  {module}");
            } else {
                let _ = writeln!(text, "  {module} -> {}", out.join(", "));
            }
        }
    }
    let _ = writeln!(text, "\ndigraph hub {{\n  rankdir=TB; node [shape=box];");
    for (layer, modules) in LAYERS {
        let names: Vec<String> = modules.iter().map(|m| format!("\"{m}\"")).collect();
        let _ = writeln!(text, "  {{ rank=same; {} }} // {layer}", names.join("; "));
    }
    for ((from, to), sites) in arrows {
        let _ = writeln!(text, "  \"{from}\" -> \"{to}\" [label={}];", sites.len());
    }
    let _ = writeln!(text, "}}");
    text
}

#[test]
fn the_hub_has_no_import_circle_no_upward_import_and_no_file_over_600_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    sources(&root, &root, &mut all);
    assert!(
        all.iter().any(|s| s.relative == "process.rs"),
        "read no hub sources under {}",
        root.display()
    );
    let arrows = arrows(&all);
    println!("{}", drawing(&arrows));

    let mut problems = arrow_problems(&arrows);
    for source in &all {
        let is_test = source.relative.ends_with("/tests.rs")
            || source.relative.contains("/tests/")
            || source.relative == "test_metrics.rs";
        let lines = lines_of_code(&source.text);
        if !is_test && lines > MAX_LINES {
            problems.push(format!(
                "src/{} has {lines} lines before its first #[cfg(test)] (at most {MAX_LINES}: \
                 split it by what the code does, tests into a tests.rs child module)",
                source.relative
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the hub's structure:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_check_sees_a_circle_and_an_upward_import() {
    let site = |s: &str| vec![s.to_string()];
    let mut arrows = Arrows::new();
    arrows.insert(
        ("binding".into(), "work".into()),
        site("src/binding/binder.rs:1"),
    );
    arrows.insert(
        ("work".into(), "binding".into()),
        site("src/work/dispatch.rs:2"),
    );
    let problems = arrow_problems(&arrows);
    assert!(
        problems.iter().any(|p| p.starts_with("upward import: `work`")
            && p.contains("src/work/dispatch.rs:2")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(
            |p| p.starts_with("import circle binding -> work -> binding")
                && p.contains("src/binding/binder.rs:1")
        ),
        "{problems:?}"
    );
}

#[test]
fn super_paths_resolve_from_the_file_and_its_inline_tests() {
    let source = Source {
        relative: "status/processor.rs".into(),
        module: vec!["status".into(), "processor".into()],
        text: "use super::handoff::Handoff;\nuse crate::work::store::WorkStore;\n// crate::binding in a comment\n#[cfg(test)]\nmod tests {\n    use super::super::super::clusters::health;\n}\n".into(),
    };
    assert_eq!(
        imports(&source),
        vec![
            ("status".to_string(), 1),
            ("work".to_string(), 2),
            ("clusters".to_string(), 6)
        ]
    );
}
