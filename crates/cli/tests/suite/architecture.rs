//! Architecture invariant: the crate map in ARCHITECTURE.md is the workspace's dependency
//! graph (DESIGN.md §8). Each line of its `crate-map` block names a crate and the keel
//! crates it depends on, `keel-x → keel-y, keel-z` or `keel-x → (none)`; normal
//! dependencies only (dev and build dependencies are left out). `cargo metadata` must agree
//! edge for edge, every workspace crate is listed once, and each crate depends only on
//! crates listed below it, so the arrows point down.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Each crate and the workspace crates it depends on.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The fence that opens the map in ARCHITECTURE.md.
const FENCE: &str = "```crate-map\n";

fn workspace_root() -> PathBuf {
    let cli = Path::new(env!("CARGO_MANIFEST_DIR"));
    cli.ancestors().nth(2).expect("crates/cli lies two folders below the workspace root").into()
}

/// The map's crates from top to bottom, and its graph.
fn crate_map(architecture: &str) -> (Vec<String>, Graph) {
    let start = architecture.find(FENCE).expect("ARCHITECTURE.md has a ```crate-map block");
    let block = &architecture[start + FENCE.len()..];
    let block = &block[..block.find("```").expect("the crate-map block is closed")];
    let mut order = Vec::new();
    let mut graph = Graph::new();
    for line in block.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let (name, dependencies) = line
            .split_once('→')
            .unwrap_or_else(|| panic!("not `crate → crate, …` or `crate → (none)`: {line:?}"));
        let name = name.trim().to_owned();
        let dependencies: BTreeSet<String> = match dependencies.trim() {
            "(none)" => BTreeSet::new(),
            list => list.split(',').map(|dependency| dependency.trim().to_owned()).collect(),
        };
        assert!(
            graph.insert(name.clone(), dependencies).is_none(),
            "{name} is listed twice in the crate map"
        );
        order.push(name);
    }
    (order, graph)
}

/// The workspace's graph as cargo resolves the manifests: each member and the members it
/// has as normal dependencies.
fn cargo_graph() -> Graph {
    // Cargo sets CARGO for the tests it runs; the same cargo reads the same manifests.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"].as_array().expect("cargo metadata lists packages");
    let members: BTreeSet<&str> =
        packages.iter().map(|package| package["name"].as_str().expect("a name")).collect();
    packages
        .iter()
        .map(|package| {
            let dependencies = package["dependencies"]
                .as_array()
                .expect("a package lists its dependencies")
                .iter()
                // `kind` is null for a normal dependency, "dev" or "build" otherwise.
                .filter(|dependency| dependency["kind"].is_null())
                .map(|dependency| dependency["name"].as_str().expect("a dependency's name"))
                .filter(|name| members.contains(name))
                .map(str::to_owned)
                .collect();
            (package["name"].as_str().expect("a name").to_owned(), dependencies)
        })
        .collect()
}

#[test]
fn the_crate_map_in_architecture_md_is_the_workspace_dependency_graph() {
    let architecture = std::fs::read_to_string(workspace_root().join("ARCHITECTURE.md"))
        .expect("ARCHITECTURE.md is readable");
    let (order, map) = crate_map(&architecture);
    let cargo = cargo_graph();

    let listed: BTreeSet<&String> = map.keys().collect();
    let members: BTreeSet<&String> = cargo.keys().collect();
    assert_eq!(listed, members, "the crate map must list exactly the workspace's crates");

    let mut wrong = Vec::new();
    for (name, dependencies) in &cargo {
        for missing in dependencies.difference(&map[name]) {
            wrong.push(format!("{name} → {missing}: in Cargo.toml, not in the crate map"));
        }
        for extra in map[name].difference(dependencies) {
            wrong.push(format!("{name} → {extra}: in the crate map, not in Cargo.toml"));
        }
    }
    for (index, name) in order.iter().enumerate() {
        for dependency in
            map[name].iter().filter(|dependency| !order[index + 1..].contains(dependency))
        {
            wrong.push(format!(
                "{name} → {dependency}: an arrow must point to a crate listed below"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md's crate map is not the workspace:\n{}",
        wrong.join("\n")
    );
}
