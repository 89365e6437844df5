//! Architecture invariant: keel-kernel depends on keel-contracts only, within the
//! workspace (DESIGN.md §8). Concrete stores, providers and tools are plugged in by hosts.

#[test]
fn kernel_depends_on_contracts_only_within_the_workspace() {
    let manifest: toml::Table =
        toml::from_str(include_str!("../../Cargo.toml")).expect("kernel manifest parses");
    let dependencies = manifest["dependencies"].as_table().expect("[dependencies] table");
    let workspace_crates: Vec<&String> =
        dependencies.keys().filter(|name| name.starts_with("keel-")).collect();
    assert_eq!(
        workspace_crates,
        vec!["keel-contracts"],
        "keel-kernel may depend on keel-contracts only"
    );
    // Build dependencies would be a back door too.
    assert!(manifest.get("build-dependencies").is_none());
}
