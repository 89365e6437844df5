//! `write_file`: create with parents, replace atomically, refuse outside.

use std::os::unix::fs::{PermissionsExt, symlink};

use keel_contracts::Outcome;
use serde_json::json;

use super::support::Fixture;

#[tokio::test]
async fn creates_parent_folders() {
    let fixture = Fixture::new();
    let output = fixture.call("write_file", json!({"path": "a/b/c.txt", "content": "hi\n"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "created `a/b/c.txt` (3 bytes)");
    assert_eq!(fixture.read("a/b/c.txt"), "hi\n");
    let mode = std::fs::metadata(fixture.root.join("a/b/c.txt")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
}

#[tokio::test]
async fn replaces_and_keeps_permissions() {
    let fixture = Fixture::new();
    fixture.write("run.sh", "old");
    let path = fixture.root.join("run.sh");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = fixture.call("write_file", json!({"path": "run.sh", "content": "new"})).await;
    assert_eq!(output.content, "replaced `run.sh` (3 bytes)");
    assert_eq!(fixture.read("run.sh"), "new");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o755);
    let leftovers: Vec<_> = std::fs::read_dir(&fixture.root)
        .unwrap()
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(".keel-write-"))
        .collect();
    assert!(leftovers.is_empty());
}

#[tokio::test]
async fn writes_the_target_of_an_inside_link() {
    let fixture = Fixture::new();
    fixture.write("real.txt", "old");
    symlink("real.txt", fixture.root.join("alias.txt")).unwrap();
    let output = fixture.call("write_file", json!({"path": "alias.txt", "content": "new"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(fixture.read("real.txt"), "new");
    assert!(std::fs::symlink_metadata(fixture.root.join("alias.txt")).unwrap().is_symlink());
}

#[tokio::test]
async fn refuses_outside_and_through_links() {
    let fixture = Fixture::new();
    let outside = fixture.outside();
    symlink(&outside, fixture.root.join("out")).unwrap();
    symlink(outside.join("not-there"), fixture.root.join("dangling")).unwrap();
    for (path, expected) in [
        ("../escaped.txt".to_owned(), "outside the workspace"),
        ("new/../../escaped.txt".to_owned(), "outside the workspace"),
        (outside.join("escaped.txt").display().to_string(), "outside the workspace"),
        ("out/escaped.txt".to_owned(), "outside the workspace"),
        ("dangling".to_owned(), "dangling symbolic link"),
        ("dangling/escaped.txt".to_owned(), "dangling symbolic link"),
    ] {
        let output = fixture.call("write_file", json!({"path": path, "content": "x"})).await;
        assert_eq!(output.outcome, Outcome::Error, "{path}");
        assert!(output.content.contains(expected), "{path}: {}", output.content);
    }
    assert!(!outside.join("escaped.txt").exists());
    assert!(!outside.join("not-there").exists());
}

#[tokio::test]
async fn refuses_a_folder() {
    let fixture = Fixture::new();
    std::fs::create_dir(fixture.root.join("dir")).unwrap();
    let output = fixture.call("write_file", json!({"path": "dir", "content": "x"})).await;
    assert_eq!(output.outcome, Outcome::Error);
    assert!(output.content.contains("is a folder"));
}

#[tokio::test]
async fn missing_content_is_an_argument_error() {
    let fixture = Fixture::new();
    let output = fixture.call("write_file", json!({"path": "a.txt"})).await;
    assert_eq!(output.outcome, Outcome::Error);
    assert!(output.content.contains("invalid arguments for write_file"));
}
