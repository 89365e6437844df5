//! `glob`: pattern matching, .gitignore, sorting, caps, errors.

use keel_contracts::Outcome;
use serde_json::json;

use super::support::Fixture;

fn project() -> Fixture {
    let fixture = Fixture::new();
    fixture.write("src/main.rs", "");
    fixture.write("src/lib.rs", "");
    fixture.write("src/deep/mod.rs", "");
    fixture.write("Cargo.toml", "");
    fixture.write("README.md", "");
    fixture.write(".gitignore", "target/\n*.log\n");
    fixture.write("target/debug/out.rs", "");
    fixture.write("build.log", "");
    fixture.write(".git/config", "");
    fixture
}

#[tokio::test]
async fn double_star_spans_folders_and_output_is_sorted() {
    let fixture = project();
    let output = fixture.call("glob", json!({"pattern": "**/*.rs"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "src/deep/mod.rs\nsrc/lib.rs\nsrc/main.rs\n");
}

#[tokio::test]
async fn single_star_stays_in_one_folder() {
    let fixture = project();
    let output = fixture.call("glob", json!({"pattern": "src/*.rs"})).await;
    assert_eq!(output.content, "src/lib.rs\nsrc/main.rs\n");
    let output = fixture.call("glob", json!({"pattern": "*"})).await;
    assert_eq!(output.content, ".gitignore\nCargo.toml\nREADME.md\n");
}

#[tokio::test]
async fn gitignored_files_and_dot_git_are_left_out() {
    let fixture = project();
    let output = fixture.call("glob", json!({"pattern": "**/*"})).await;
    assert!(!output.content.contains("target/"), "{}", output.content);
    assert!(!output.content.contains("build.log"), "{}", output.content);
    assert!(!output.content.contains(".git/"), "{}", output.content);
    assert!(output.content.contains("src/main.rs"));
}

#[tokio::test]
async fn path_narrows_the_search_and_output_stays_workspace_relative() {
    let fixture = project();
    let output = fixture.call("glob", json!({"pattern": "*.rs", "path": "src"})).await;
    assert_eq!(output.content, "src/lib.rs\nsrc/main.rs\n");
}

#[tokio::test]
async fn no_match_is_ok() {
    let fixture = project();
    let output = fixture.call("glob", json!({"pattern": "**/*.py"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "no files match `**/*.py`");
}

#[tokio::test]
async fn results_are_capped() {
    let fixture = Fixture::new();
    for n in 0..1010 {
        fixture.write(&format!("many/f{n:04}.txt"), "");
    }
    let output = fixture.call("glob", json!({"pattern": "**/*.txt"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content.lines().filter(|line| line.starts_with("many/")).count(), 1000);
    assert!(output.content.contains("[10 more matches not shown"), "{}", output.content);
}

#[tokio::test]
async fn errors() {
    let fixture = project();
    for (arguments, expected) in [
        (json!({"pattern": "/etc/*"}), "is absolute"),
        (json!({"pattern": "../*"}), "contains `..`"),
        (json!({"pattern": "src/[a"}), "invalid glob pattern"),
        (json!({"pattern": ""}), "empty"),
        (json!({"pattern": "*", "path": "Cargo.toml"}), "not a folder"),
        (json!({"pattern": "*", "path": ".."}), "outside the workspace"),
        (json!({"path": "src"}), "invalid arguments for glob"),
    ] {
        let output = fixture.call("glob", arguments.clone()).await;
        assert_eq!(output.outcome, Outcome::Error, "{arguments}");
        assert!(output.content.contains(expected), "{arguments}: {}", output.content);
    }
}
