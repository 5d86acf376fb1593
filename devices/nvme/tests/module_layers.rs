//! The crate's modules form layers, as `lib.rs` documents: no module
//! imports one that imports it back, directly or not. This test reads the
//! `crate::` paths of every module's non-test code and fails on a circle,
//! naming the modules in it. It catches a handler that reaches into the
//! controller or the worker, the ring the shared state was moved out of.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Top-level module names: `foo.rs` and `foo/` under `src/`.
fn modules(src: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in fs::read_dir(src).expect("src/ is readable") {
        let path = entry.expect("directory entry").path();
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if path.is_dir() || path.extension().is_some_and(|e| e == "rs") {
            names.insert(name);
        }
    }
    for not_a_layer in ["lib", "main", "tests"] {
        names.remove(not_a_layer);
    }
    names
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for entry in fs::read_dir(path).expect("readable directory") {
            rust_files(&entry.expect("directory entry").path(), out);
        }
    } else if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The modules `text` names as `crate::x` (also inside `crate::{x, y}`),
/// test code (from `#[cfg(test)] mod tests` on) and comments left out.
fn crate_paths(text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    let code: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group
                .split('}')
                .next()
                .unwrap_or("")
                .split(',')
                .map(|item| item.trim().split("::").next().unwrap_or(""))
                .collect(),
            None => vec![rest
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("")],
        };
        found.extend(
            names
                .into_iter()
                .filter(|n| known.contains(*n))
                .map(String::from),
        );
    }
    found
}

#[test]
fn modules_import_each_other_in_layers_without_circles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let known = modules(&src);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for module in &known {
        let mut files = Vec::new();
        rust_files(&src.join(format!("{module}.rs")), &mut files);
        rust_files(&src.join(module), &mut files);
        let deps = graph.entry(module.clone()).or_default();
        for file in files {
            let text = fs::read_to_string(&file).expect("readable source");
            deps.extend(crate_paths(&text, &known));
        }
        deps.remove(module);
    }
    assert!(
        graph["admin"].contains("state") && graph["controller"].contains("state"),
        "the parser sees no imports at all: {graph:?}"
    );
    // Peel off layers of modules whose imports are all below; what is left
    // when none can be peeled is a circle.
    let mut left = graph.clone();
    let mut layers = Vec::new();
    while !left.is_empty() {
        let layer: BTreeSet<String> = left
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !left.contains_key(d)))
            .map(|(m, _)| m.clone())
            .collect();
        assert!(
            !layer.is_empty(),
            "modules import each other in a circle among {:?} (layers so far: {layers:?})",
            left.keys().collect::<Vec<_>>()
        );
        left.retain(|m, _| !layer.contains(m));
        layers.push(layer);
    }
    for handlers in ["admin", "io"] {
        for above in ["controller", "worker", "server"] {
            assert!(
                !graph[handlers].contains(above),
                "{handlers} imports {above}: handlers depend on the state only"
            );
        }
    }
}
