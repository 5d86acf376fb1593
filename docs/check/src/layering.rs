//! The workspace's structure, checked: which crate may depend on which, and
//! that the modules inside every crate import each other in one direction.
//!
//! - **Crate layers.** `docs/development/layering.md` declares the layers
//!   once, in a table between `<!-- crate-layers -->` markers (one row per
//!   layer, lowest first). Every workspace member sits in exactly one
//!   layer, and every normal or build dependency on another member points
//!   to a strictly lower layer ([`check_crate_layers`]). Dev-dependencies
//!   are free: tests may reach anything.
//! - **Module circles.** In every crate root (a library, a `src/main.rs`,
//!   a `src/bin/NAME/main.rs`), the top-level modules' `crate::` paths form
//!   a graph, which must have no circle ([`module_graph`], [`layers_of`]).
//!   Test code is left out: a file named `tests.rs` or under a `tests/`
//!   folder, and everything after a column-0 `#[cfg(test)]`.
//!
//! `tests/layering.rs` runs these checks on the real workspace (through
//! `cargo metadata`); the unit tests here run them on small made-up
//! inputs, so a parser that silently sees nothing fails there.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The crate layers a layering document declares: crate name to layer
/// number (0 is the ground).
pub type Layers = BTreeMap<String, usize>;

/// Reads the layer table between the `<!-- crate-layers -->` markers of
/// `doc`: a Markdown table whose first column is the layer's name and
/// whose second column lists its crates in backticks, lowest layer first.
pub fn parse_layers(doc: &str) -> Result<Layers, String> {
    const MARK: &str = "<!-- crate-layers -->";
    let mut parts = doc.split(MARK);
    let (Some(_), Some(table), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("the layer table must sit between two {MARK} lines"));
    };
    let mut layers = Layers::new();
    let mut layer = 0;
    for row in table.lines().map(str::trim).filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let Some(crates) = cells.get(1) else { continue };
        // The header and the |---| line name no crate in backticks.
        let names: Vec<&str> = crates
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            continue;
        }
        for name in names {
            if let Some(first) = layers.insert(name.to_owned(), layer) {
                return Err(format!(
                    "{name} is listed twice (layers {first} and {layer})"
                ));
            }
        }
        layer += 1;
    }
    if layers.is_empty() {
        return Err("the layer table lists no crate".into());
    }
    Ok(layers)
}

/// One dependency of a workspace member on another member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    /// The depending crate.
    pub from: String,
    /// The crate depended on.
    pub to: String,
    /// `normal`, `build` or `dev`.
    pub kind: String,
}

/// Every way the crate graph breaks the declared layers: a member missing
/// from the table, a listed crate that is no member, a dependency that
/// does not point strictly down. Empty when all is well.
pub fn check_crate_layers(
    layers: &Layers,
    members: &BTreeSet<String>,
    dependencies: &[Dependency],
) -> Vec<String> {
    let mut problems = Vec::new();
    for member in members {
        if !layers.contains_key(member) {
            problems.push(format!(
                "{member} is in no layer: add it to the table in docs/development/layering.md"
            ));
        }
    }
    for listed in layers.keys() {
        if !members.contains(listed) {
            problems.push(format!(
                "{listed} is in the layer table but is no workspace member"
            ));
        }
    }
    for dep in dependencies.iter().filter(|d| d.kind != "dev") {
        if let (Some(&from), Some(&to)) = (layers.get(&dep.from), layers.get(&dep.to)) {
            if to >= from {
                problems.push(format!(
                    "{} (layer {from}) depends on {} (layer {to}): a crate depends only on \
                     lower layers",
                    dep.from, dep.to
                ));
            }
        }
    }
    problems
}

/// A crate root and the folder its top-level modules live in.
#[derive(Debug, Clone)]
pub struct CrateRoot {
    /// For messages: `p2plab-nvme (lib)`.
    pub name: String,
    /// `src/lib.rs`, `src/main.rs` or `src/bin/NAME/main.rs`.
    pub root_file: PathBuf,
}

impl CrateRoot {
    /// The folder that holds the root's modules.
    fn dir(&self) -> &Path {
        self.root_file.parent().unwrap_or(Path::new("."))
    }

    /// The top-level modules: `NAME.rs` and `NAME/` in the root's folder,
    /// without other crate roots (`lib.rs`, `main.rs`, `bin/`) and tests.
    /// A `src/main.rs` beside a `src/lib.rs` declares no modules of its own
    /// here (checked by [`main_declares_modules`]), so it gets none.
    pub fn modules(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let is_main = self.root_file.file_name().is_some_and(|f| f == "main.rs");
        if is_main && self.dir().join("lib.rs").is_file() {
            return names;
        }
        let Ok(entries) = fs::read_dir(self.dir()) else {
            return names;
        };
        for path in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if path.is_dir() || path.extension().is_some_and(|e| e == "rs") {
                names.insert(stem.to_owned());
            }
        }
        for not_a_module in ["lib", "main", "bin", "tests"] {
            names.remove(not_a_module);
        }
        names
    }
}

/// Whether a binary root's text declares file modules (`mod x;`).
pub fn main_declares_modules(text: &str) -> bool {
    text.lines().map(str::trim_start).any(|line| {
        let line = line.strip_prefix("pub ").unwrap_or(line);
        line.starts_with("mod ") && line.trim_end().ends_with(';')
    })
}

/// The part of a file's text that is production code: comments out,
/// everything from a column-0 `#[cfg(test)]` on left out.
pub fn production_code(text: &str) -> String {
    let text = match text.find("\n#[cfg(test)]") {
        Some(at) => &text[..at],
        None if text.starts_with("#[cfg(test)]") => "",
        None => text,
    };
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first path segments `code` names after `crate::`, also inside
/// `crate::{a::X, b}` groups.
pub fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        // `$crate::` in a macro is another crate's root.
        if code[..at].ends_with('$') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1usize;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => items.push(std::mem::take(&mut item)),
                    _ if depth == 1 => item.push(c),
                    _ => {}
                }
            }
            items.push(item);
            found.extend(items.iter().filter_map(|i| first_segment(i)));
        } else if let Some(name) = first_segment(rest) {
            found.insert(name);
        }
    }
    found
}

fn first_segment(path: &str) -> Option<String> {
    let name: String = path
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty() && name != "self").then_some(name)
}

/// Which top-level module defines each name the root file re-exports
/// (`pub use a::{Foo, Bar}` makes `crate::Foo` an edge to `a`).
pub fn root_reexports(root_text: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let code = production_code(root_text);
    for statement in code.split(';') {
        let statement = statement.trim();
        let Some(path) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let path = path.strip_prefix("crate::").unwrap_or(path);
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        if !modules.contains(module) {
            continue;
        }
        let names: Vec<String> = match rest.trim().strip_prefix('{') {
            Some(group) => group
                .trim_end_matches('}')
                .split(',')
                .filter_map(|item| {
                    let item = item.trim();
                    let name = item.rsplit(" as ").next().unwrap_or(item);
                    name.rsplit("::").next().map(|n| n.trim().to_owned())
                })
                .filter(|n| !n.is_empty() && n != "*")
                .collect(),
            None => {
                let name = rest.rsplit(" as ").next().unwrap_or(rest);
                vec![name.rsplit("::").next().unwrap_or(name).trim().to_owned()]
            }
        };
        for name in names {
            map.insert(name, module.to_owned());
        }
    }
    map
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let Ok(entries) = fs::read_dir(path) else {
            return;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            if path.file_name().is_some_and(|n| n == "tests") {
                continue;
            }
            rust_files(&path, out);
        }
    } else if path.is_file()
        && path.extension().is_some_and(|e| e == "rs")
        && path.file_name().is_none_or(|n| n != "tests.rs")
    {
        out.push(path.to_path_buf());
    }
}

/// The module graph of one crate root: each top-level module and the
/// other top-level modules its production code names.
pub fn module_graph(root: &CrateRoot) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let modules = root.modules();
    let root_text = fs::read_to_string(&root.root_file)
        .map_err(|e| format!("{}: {e}", root.root_file.display()))?;
    let reexports = root_reexports(&root_text, &modules);
    let mut graph = BTreeMap::new();
    for module in &modules {
        let mut files = Vec::new();
        rust_files(&root.dir().join(format!("{module}.rs")), &mut files);
        rust_files(&root.dir().join(module), &mut files);
        let mut deps = BTreeSet::new();
        for file in files {
            let text = fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            for name in crate_paths(&production_code(&text)) {
                let target = if modules.contains(&name) {
                    Some(name)
                } else {
                    reexports.get(&name).cloned()
                };
                deps.extend(target.filter(|t| t != module));
            }
        }
        graph.insert(module.clone(), deps);
    }
    Ok(graph)
}

/// Peels the graph into layers (each module's imports all in layers
/// below); `Err` names the modules left in a circle.
pub fn layers_of(
    graph: &BTreeMap<String, BTreeSet<String>>,
) -> Result<Vec<BTreeSet<String>>, BTreeSet<String>> {
    let mut left = graph.clone();
    let mut layers = Vec::new();
    while !left.is_empty() {
        let layer: BTreeSet<String> = left
            .iter()
            .filter(|(_, deps)| deps.iter().all(|d| !left.contains_key(d)))
            .map(|(m, _)| m.clone())
            .collect();
        if layer.is_empty() {
            // Only modules on or behind a circle are left; drop those that
            // nothing left depends on, to name the circle itself.
            loop {
                let needed: BTreeSet<String> = left.values().flatten().cloned().collect();
                let before = left.len();
                left.retain(|m, _| needed.contains(m));
                if left.len() == before {
                    break;
                }
            }
            return Err(left.into_keys().collect());
        }
        left.retain(|m, _| !layer.contains(m));
        layers.push(layer);
    }
    Ok(layers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    /// Catches a table parser that skips rows, numbers layers wrongly, or
    /// takes the header for a layer.
    #[test]
    fn the_layer_table_numbers_rows_from_the_ground_up() {
        let doc = "intro\n<!-- crate-layers -->\n| layer | crates |\n|---|---|\n\
                   | ground | `a`, `b` |\n| transport | `c` |\n<!-- crate-layers -->\nafter";
        let layers = parse_layers(doc).unwrap();
        assert_eq!(layers["a"], 0);
        assert_eq!(layers["b"], 0);
        assert_eq!(layers["c"], 1);
        assert_eq!(layers.len(), 3);
        assert!(parse_layers("no markers").is_err());
        let twice = "<!-- crate-layers -->\n| x | `a` |\n| y | `a` |\n<!-- crate-layers -->";
        assert!(parse_layers(twice).unwrap_err().contains("twice"));
    }

    /// Catches a check that lets a dependency go sideways or up, forgets
    /// unlisted members, or counts dev-dependencies.
    #[test]
    fn dependencies_must_point_strictly_down() {
        let layers: Layers = [("a", 0), ("b", 0), ("c", 1)]
            .map(|(n, l)| (n.to_string(), l))
            .into_iter()
            .collect();
        let dep = |from: &str, to: &str, kind: &str| Dependency {
            from: from.into(),
            to: to.into(),
            kind: kind.into(),
        };
        let members = set(&["a", "b", "c"]);
        assert!(check_crate_layers(&layers, &members, &[dep("c", "a", "normal")]).is_empty());
        assert!(check_crate_layers(&layers, &members, &[dep("a", "c", "dev")]).is_empty());
        let up = check_crate_layers(&layers, &members, &[dep("a", "c", "normal")]);
        assert_eq!(up.len(), 1, "{up:?}");
        let sideways = check_crate_layers(&layers, &members, &[dep("a", "b", "build")]);
        assert_eq!(sideways.len(), 1, "{sideways:?}");
        let unlisted = check_crate_layers(&layers, &set(&["a", "b", "c", "d"]), &[]);
        assert!(unlisted[0].contains("d is in no layer"), "{unlisted:?}");
        let gone = check_crate_layers(&layers, &set(&["a", "b"]), &[]);
        assert!(gone[0].contains("c is in the layer table"), "{gone:?}");
    }

    /// Catches a path reader that misses grouped or nested imports, reads
    /// `$crate::` (another crate) or comments, or keeps test code.
    #[test]
    fn crate_paths_are_read_from_code_only() {
        let text = "use crate::{a::X, b, c::{D, E}};\nuse crate::f;\n// crate::g\n\
                    fn x() { crate::h::go(); $crate::i::no(); }\n#[cfg(test)]\nmod tests { use crate::j; }";
        let code = production_code(text);
        assert_eq!(crate_paths(&code), set(&["a", "b", "c", "f", "h"]));
    }

    /// Catches a re-export reader that loses names, so `crate::Foo` (a
    /// root re-export) would hide an edge.
    #[test]
    fn root_reexports_point_at_their_modules() {
        let modules = set(&["model", "pci"]);
        let root = "mod model;\npub use model::{Gpu, StatsReader as Reader};\npub use pci::gpu_function;\npub use std::io;";
        let map = root_reexports(root, &modules);
        assert_eq!(map["Gpu"], "model");
        assert_eq!(map["Reader"], "model");
        assert_eq!(map["gpu_function"], "pci");
        assert!(!map.contains_key("io"));
    }

    /// Catches a circle check that passes a loop, or names modules that
    /// only hang off one.
    #[test]
    fn circles_are_found_and_named() {
        let graph: BTreeMap<String, BTreeSet<String>> = [
            ("a", set(&[])),
            ("b", set(&["a"])),
            ("c", set(&["b", "d"])),
            ("d", set(&["c"])),
            ("e", set(&["c"])),
        ]
        .into_iter()
        .map(|(m, d)| (m.to_string(), d))
        .collect();
        assert_eq!(layers_of(&graph).unwrap_err(), set(&["c", "d"]));
        let mut fine = graph.clone();
        fine.insert("d".into(), set(&["a"]));
        let layers = layers_of(&fine).unwrap();
        assert_eq!(layers[0], set(&["a"]));
        assert_eq!(layers.len(), 4);
    }

    #[test]
    fn a_binary_root_with_file_modules_is_noticed() {
        assert!(main_declares_modules("mod text;\nfn main() {}"));
        assert!(!main_declares_modules("mod tests {\n}\nfn main() {}"));
    }
}
