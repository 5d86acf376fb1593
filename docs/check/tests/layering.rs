//! The real workspace against its declared structure (see the crate's
//! documentation): crate layers from docs/development/layering.md, and no
//! module circle in any crate root of any member.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use p2plab_docs::layering::{
    check_crate_layers, layers_of, main_declares_modules, module_graph, parse_layers, CrateRoot,
    Dependency,
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `cargo metadata` of the workspace, without resolving registries.
fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

fn packages(meta: &serde_json::Value) -> &Vec<serde_json::Value> {
    meta["packages"].as_array().expect("packages")
}

/// Catches a crate that depends on one beside or above it (the transport
/// on a device, p2plab-dma on the transport, a model on a server binary's
/// crate), and a new crate nobody placed in a layer.
#[test]
fn crates_depend_only_on_lower_layers() {
    let doc = std::fs::read_to_string(repo().join("docs/development/layering.md"))
        .expect("docs/development/layering.md is readable");
    let layers = parse_layers(&doc).expect("the layer table parses");
    let meta = metadata();
    let members: BTreeSet<String> = packages(&meta)
        .iter()
        .filter_map(|p| p["name"].as_str().map(String::from))
        .collect();
    assert!(members.len() >= 10, "cargo metadata saw {members:?}");
    let mut dependencies = Vec::new();
    for package in packages(&meta) {
        let from = package["name"].as_str().unwrap_or_default();
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let to = dep["name"].as_str().unwrap_or_default();
            if members.contains(to) && to != from {
                dependencies.push(Dependency {
                    from: from.into(),
                    to: to.into(),
                    kind: dep["kind"].as_str().unwrap_or("normal").into(),
                });
            }
        }
    }
    assert!(
        dependencies.iter().any(|d| d.kind != "dev"),
        "no dependency between members was read: {dependencies:?}"
    );
    let problems = check_crate_layers(&layers, &members, &dependencies);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Catches modules that import each other in a circle, in any crate root
/// of any member (a library, a server's main.rs, a tool's bin folder).
#[test]
fn no_crate_has_a_module_circle() {
    let meta = metadata();
    let mut roots = Vec::new();
    for package in packages(&meta) {
        let name = package["name"].as_str().unwrap_or_default();
        for target in package["targets"].as_array().into_iter().flatten() {
            let kinds: Vec<&str> = target["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str())
                .collect();
            if !kinds
                .iter()
                .any(|k| ["lib", "rlib", "cdylib", "bin"].contains(k))
            {
                continue;
            }
            let file = PathBuf::from(target["src_path"].as_str().unwrap_or_default());
            let crate_root = ["lib.rs", "main.rs"]
                .iter()
                .any(|f| file.file_name().is_some_and(|n| n == *f));
            if crate_root {
                roots.push(CrateRoot {
                    name: format!("{name} ({})", target["name"].as_str().unwrap_or("?")),
                    root_file: file,
                });
            }
        }
    }
    let mut failures = Vec::new();
    let mut edges = 0;
    for root in &roots {
        if root.modules().is_empty() && root.root_file.ends_with("main.rs") {
            // A server's main.rs beside its lib.rs: wiring, no modules.
            let text = std::fs::read_to_string(&root.root_file).unwrap_or_default();
            assert!(
                !main_declares_modules(&text),
                "{} declares file modules beside a lib.rs: give it a bin folder",
                root.name
            );
            continue;
        }
        let graph = module_graph(root).unwrap_or_else(|e| panic!("{}: {e}", root.name));
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        if let Err(circle) = layers_of(&graph) {
            failures.push(format!("{}: modules in a circle: {circle:?}", root.name));
        }
    }
    assert!(roots.len() >= 10, "found only {} crate roots", roots.len());
    assert!(
        edges > 100,
        "the module reader sees almost no imports ({edges})"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Catches an NVMe command handler that reaches into the controller, the
/// queue worker or the server: handlers work on the controller state only
/// (so they run the same under a test harness as under the server).
#[test]
fn nvme_handlers_depend_on_the_state_only() {
    let root = CrateRoot {
        name: "p2plab-nvme (lib)".into(),
        root_file: repo().join("devices/nvme/src/lib.rs"),
    };
    let graph = module_graph(&root).expect("the nvme crate reads");
    assert!(
        graph["admin"].contains("state") && graph["controller"].contains("state"),
        "the reader sees no imports at all: {graph:?}"
    );
    for handlers in ["admin", "io"] {
        for above in ["controller", "worker", "server"] {
            assert!(
                !graph[handlers].contains(above),
                "{handlers} imports {above}: handlers depend on the state only"
            );
        }
    }
}
