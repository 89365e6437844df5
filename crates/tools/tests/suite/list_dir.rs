//! `list_dir`: sorted entries, folders and links marked, never followed.

use std::os::unix::fs::symlink;

use keel_contracts::Outcome;
use serde_json::json;

use super::support::Fixture;

#[tokio::test]
async fn lists_sorted_with_markers() {
    let fixture = Fixture::new();
    fixture.write("b.txt", "");
    fixture.write(".hidden", "");
    fixture.write("src/main.rs", "");
    symlink("src", fixture.root.join("alias")).unwrap();
    let output = fixture.call("list_dir", json!({"path": "."})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, ".hidden\nalias -> src\nb.txt\nsrc/\n");
}

#[tokio::test]
async fn lists_through_an_inside_link() {
    let fixture = Fixture::new();
    fixture.write("src/main.rs", "");
    symlink("src", fixture.root.join("alias")).unwrap();
    let output = fixture.call("list_dir", json!({"path": "alias"})).await;
    assert_eq!(output.content, "main.rs\n");
}

#[tokio::test]
async fn empty_folder() {
    let fixture = Fixture::new();
    std::fs::create_dir(fixture.root.join("empty")).unwrap();
    let output = fixture.call("list_dir", json!({"path": "empty"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(output.content.contains("is empty"));
}

#[tokio::test]
async fn errors() {
    let fixture = Fixture::new();
    fixture.write("file", "");
    for (path, expected) in [
        ("file", "not a folder"),
        ("missing", "not a folder"),
        ("..", "outside the workspace"),
        ("/", "outside the workspace"),
    ] {
        let output = fixture.call("list_dir", json!({"path": path})).await;
        assert_eq!(output.outcome, Outcome::Error, "{path}");
        assert!(output.content.contains(expected), "{path}: {}", output.content);
    }
}
