//! `edit_file`: exact single replacement, replace_all, clear errors.

use keel_contracts::Outcome;
use serde_json::json;

use super::support::Fixture;

#[tokio::test]
async fn replaces_exactly_one_match() {
    let fixture = Fixture::new();
    fixture.write("lib.rs", "fn f(n: u32) -> u32 {\n    n - 1\n}\n");
    let output =
        fixture.call("edit_file", json!({"path": "lib.rs", "old": "n - 1", "new": "n"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "replaced 1 occurrence in `lib.rs`");
    assert_eq!(fixture.read("lib.rs"), "fn f(n: u32) -> u32 {\n    n\n}\n");
}

#[tokio::test]
async fn several_matches_need_replace_all() {
    let fixture = Fixture::new();
    fixture.write("a.txt", "foo bar foo baz foo\n");
    let output =
        fixture.call("edit_file", json!({"path": "a.txt", "old": "foo", "new": "qux"})).await;
    assert_eq!(output.outcome, Outcome::Error);
    assert!(output.content.contains("matches 3 times"), "{}", output.content);
    assert!(output.content.contains("replace_all"));
    assert_eq!(fixture.read("a.txt"), "foo bar foo baz foo\n");

    let output = fixture
        .call(
            "edit_file",
            json!({"path": "a.txt", "old": "foo", "new": "qux", "replace_all": true}),
        )
        .await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "replaced 3 occurrences in `a.txt`");
    assert_eq!(fixture.read("a.txt"), "qux bar qux baz qux\n");
}

#[tokio::test]
async fn no_match_is_an_error_and_the_file_is_unchanged() {
    let fixture = Fixture::new();
    fixture.write("a.txt", "    indented\n");
    let output = fixture
        .call("edit_file", json!({"path": "a.txt", "old": "  indented\t", "new": "x"}))
        .await;
    assert_eq!(output.outcome, Outcome::Error);
    assert!(output.content.contains("was not found"), "{}", output.content);
    assert_eq!(fixture.read("a.txt"), "    indented\n");
}

#[tokio::test]
async fn other_errors() {
    let fixture = Fixture::new();
    fixture.write("a.txt", "abc\n");
    std::fs::write(fixture.root.join("latin1.txt"), b"caf\xe9\n").unwrap();
    for (arguments, expected) in [
        (json!({"path": "a.txt", "old": "", "new": "x"}), "`old` is empty"),
        (json!({"path": "a.txt", "old": "abc", "new": "abc"}), "are the same"),
        (json!({"path": "missing.txt", "old": "a", "new": "b"}), "not an existing file"),
        (json!({"path": "latin1.txt", "old": "caf", "new": "b"}), "not UTF-8"),
        (json!({"path": "../a.txt", "old": "a", "new": "b"}), "outside the workspace"),
        (json!({"path": "a.txt", "old": "a"}), "invalid arguments for edit_file"),
    ] {
        let output = fixture.call("edit_file", arguments.clone()).await;
        assert_eq!(output.outcome, Outcome::Error, "{arguments}");
        assert!(output.content.contains(expected), "{arguments}: {}", output.content);
    }
    assert_eq!(fixture.read("a.txt"), "abc\n");
}
