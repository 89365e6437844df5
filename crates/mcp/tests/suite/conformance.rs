//! The official MCP conformance suite's client scenarios against keel's client
//! (`keel-mcp-conformance-client`), for every scenario of `docs/mcp-conformance.md`'s pass list.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder holding the suite's `node_modules`: `KEEL_MCP_CONFORMANCE_DIR` (set by
/// `scripts/test`). Fails (never skips) when the suite is not installed.
fn suite_dir() -> PathBuf {
    let dir = std::env::var_os("KEEL_MCP_CONFORMANCE_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance"));
    assert!(
        dir.join("node_modules/.bin/conformance").is_file()
            && dir.join("node_modules/.bin/node").is_file(),
        "the MCP conformance suite is not installed in {}: run `scripts/test`, which installs \
         it, (or point KEEL_MCP_CONFORMANCE_DIR at a folder with its node_modules)",
        dir.display()
    );
    dir
}

/// The scenarios of the `## Pass list` section of docs/mcp-conformance.md.
fn pass_list() -> Vec<String> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/mcp-conformance.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let section = text.split("## Pass list").nth(1).expect("a `## Pass list` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// `conformance ARGS` on the pinned Node (its `.bin` first on PATH).
fn conformance(dir: &Path, args: &[&str]) -> std::process::Output {
    let bin = dir.join("node_modules/.bin");
    let path = std::env::join_paths(
        std::iter::once(bin.clone())
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    Command::new(bin.join("conformance")).args(args).env("PATH", path).output().unwrap()
}

#[test]
fn the_pinned_suite_runs_on_node_22_or_newer() {
    let dir = suite_dir();
    let output =
        Command::new(dir.join("node_modules/.bin/node")).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&output.stdout);
    let major: u32 =
        version.trim().trim_start_matches('v').split('.').next().unwrap().parse().unwrap();
    assert!(major >= 22, "node {version}");
}

#[test]
fn every_scenario_of_the_pass_list_passes() {
    let dir = suite_dir();
    let scenarios = pass_list();
    assert!(scenarios.iter().any(|s| s == "initialize"), "{scenarios:?}");
    let listed = conformance(&dir, &["list"]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let client = env!("CARGO_BIN_EXE_keel-mcp-conformance-client");
    let results = tempfile::tempdir().unwrap();
    let mut failed = Vec::new();
    for scenario in &scenarios {
        assert!(
            listed.contains(&format!("  - {scenario} [")),
            "the suite no longer offers scenario {scenario}:\n{listed}"
        );
        let output = results.path().join(scenario.replace('/', "_"));
        let run = conformance(
            &dir,
            &[
                "client",
                "--command",
                client,
                "--scenario",
                scenario,
                "--timeout",
                "60000",
                "-o",
                output.to_str().unwrap(),
            ],
        );
        // The suite prints its summary on stdout and its progress on stderr.
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        let passed = text.contains("OVERALL: PASSED") && !text.contains("OVERALL: FAILED");
        if !run.status.success() || !passed {
            failed.push(format!("{scenario} ({}):\n{text}", run.status));
        }
    }
    assert!(failed.is_empty(), "scenarios of the pass list failed:\n{}", failed.join("\n\n"));
}
