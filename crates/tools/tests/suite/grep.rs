//! `grep`: regex search, file filters, .gitignore, binary files, caps, errors.

use keel_contracts::Outcome;
use serde_json::json;

use super::support::Fixture;

fn project() -> Fixture {
    let fixture = Fixture::new();
    fixture.write("src/main.rs", "fn main() {\n    helper();\n}\n");
    fixture.write("src/lib.rs", "pub fn helper() {}\n");
    fixture.write("docs/notes.md", "call helper() first\n");
    fixture.write(".gitignore", "target/\n");
    fixture.write("target/gen.rs", "fn helper() {}\n");
    std::fs::write(fixture.root.join("src/blob.bin"), b"helper\0\x01\x02").unwrap();
    fixture
}

#[tokio::test]
async fn matches_as_path_line_text() {
    let fixture = project();
    let output = fixture.call("grep", json!({"pattern": r"helper\(\)"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(
        output.content,
        "docs/notes.md:1:call helper() first\nsrc/lib.rs:1:pub fn helper() {}\nsrc/main.rs:2:    helper();\n"
    );
}

#[tokio::test]
async fn glob_filters_by_name_or_by_path() {
    let fixture = project();
    let output = fixture.call("grep", json!({"pattern": "helper", "glob": "*.md"})).await;
    assert_eq!(output.content, "docs/notes.md:1:call helper() first\n");
    let output = fixture.call("grep", json!({"pattern": "helper", "glob": "src/*.rs"})).await;
    assert_eq!(output.content, "src/lib.rs:1:pub fn helper() {}\nsrc/main.rs:2:    helper();\n");
}

#[tokio::test]
async fn path_can_be_a_folder_or_a_file() {
    let fixture = project();
    let output = fixture.call("grep", json!({"pattern": "helper", "path": "docs"})).await;
    assert_eq!(output.content, "docs/notes.md:1:call helper() first\n");
    let output = fixture.call("grep", json!({"pattern": "fn", "path": "src/main.rs"})).await;
    assert_eq!(output.content, "src/main.rs:1:fn main() {\n");
}

#[tokio::test]
async fn case_insensitive_with_inline_flag() {
    let fixture = project();
    let output = fixture.call("grep", json!({"pattern": "(?i)FN MAIN"})).await;
    assert_eq!(output.content, "src/main.rs:1:fn main() {\n");
}

#[tokio::test]
async fn ignored_and_binary_files_are_skipped() {
    let fixture = project();
    let output = fixture.call("grep", json!({"pattern": "helper"})).await;
    assert!(!output.content.contains("target/"), "{}", output.content);
    assert!(!output.content.contains("blob.bin"), "{}", output.content);
}

#[tokio::test]
async fn no_match_is_ok() {
    let fixture = project();
    let output = fixture.call("grep", json!({"pattern": "nothing-like-this"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(output.content, "no matches for `nothing-like-this`");
}

#[tokio::test]
async fn matches_are_capped() {
    let fixture = Fixture::new();
    fixture.write("big.txt", &"hit\n".repeat(600));
    let output = fixture.call("grep", json!({"pattern": "hit"})).await;
    assert_eq!(output.content.lines().filter(|line| line.starts_with("big.txt:")).count(), 500);
    assert!(output.content.contains("[stopped at 500 matching lines"));
}

#[tokio::test]
async fn non_utf8_lines_are_made_safe() {
    let fixture = Fixture::new();
    std::fs::write(fixture.root.join("latin1.txt"), b"caf\xe9 au lait\n").unwrap();
    let output = fixture.call("grep", json!({"pattern": "lait"})).await;
    assert_eq!(
        output.content,
        "latin1.txt:1:caf\\xe9 au lait\n[keel: 1 byte shown as \\xNN escapes (not UTF-8 text or control bytes); the ledger keeps the exact bytes]\n"
    );
}

#[tokio::test]
async fn errors() {
    let fixture = project();
    for (arguments, expected) in [
        (json!({"pattern": "("}), "invalid regex"),
        (json!({"pattern": "x", "glob": "[z"}), "invalid glob pattern"),
        (json!({"pattern": "x", "path": "missing"}), "not a file or folder"),
        (json!({"pattern": "x", "path": "../.."}), "outside the workspace"),
        (json!({"pattern": 3}), "invalid arguments for grep"),
    ] {
        let output = fixture.call("grep", arguments.clone()).await;
        assert_eq!(output.outcome, Outcome::Error, "{arguments}");
        assert!(output.content.contains(expected), "{arguments}: {}", output.content);
    }
}
