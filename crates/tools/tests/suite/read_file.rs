//! `read_file`: numbered lines, paging, binary refusal, errors.

use keel_contracts::Outcome;
use serde_json::json;

use super::support::Fixture;

#[tokio::test]
async fn numbered_lines_like_cat_n() {
    let fixture = Fixture::new();
    fixture.write("a.txt", "one\ntwo\r\nthree");
    let output = fixture.call("read_file", json!({"path": "a.txt"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(
        output.content,
        "     1\tone\n     2\ttwo\n     3\tthree\n[keel: it has mixed line endings: 1 CRLF and 1 LF \
         (shown without \\r); edit_file keeps each line's ending, so write `old` and `new` with \
         plain \\n]\n"
    );
}

#[tokio::test]
async fn absolute_path_inside_the_workspace() {
    let fixture = Fixture::new();
    fixture.write("a.txt", "x\n");
    let path = fixture.root.join("a.txt");
    let output = fixture.call("read_file", json!({"path": path})).await;
    assert_eq!(output.content, "     1\tx\n");
}

#[tokio::test]
async fn offset_and_limit_page_through() {
    let fixture = Fixture::new();
    let content: String = (1..=10).map(|n| format!("line {n}\n")).collect();
    fixture.write("a.txt", &content);
    let output = fixture.call("read_file", json!({"path": "a.txt", "offset": 3, "limit": 2})).await;
    assert_eq!(
        output.content,
        "     3\tline 3\n     4\tline 4\n[more lines follow; continue with offset=5]\n"
    );
    let output = fixture.call("read_file", json!({"path": "a.txt", "offset": 9})).await;
    assert_eq!(output.content, "     9\tline 9\n    10\tline 10\n");
}

#[tokio::test]
async fn offset_past_the_end_is_an_error() {
    let fixture = Fixture::new();
    fixture.write("a.txt", "one\ntwo\n");
    let output = fixture.call("read_file", json!({"path": "a.txt", "offset": 5})).await;
    assert_eq!(output.outcome, Outcome::Error);
    assert!(output.content.contains("past the end"), "{}", output.content);
    assert!(output.content.contains("2 lines"), "{}", output.content);
}

#[tokio::test]
async fn empty_file() {
    let fixture = Fixture::new();
    fixture.write("empty", "");
    let output = fixture.call("read_file", json!({"path": "empty"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(output.content.contains("is empty"));
}

#[tokio::test]
async fn binary_files_are_refused() {
    let fixture = Fixture::new();
    std::fs::write(fixture.root.join("blob.bin"), [0x7f, b'E', b'L', b'F', 0, 1, 2]).unwrap();
    let output = fixture.call("read_file", json!({"path": "blob.bin"})).await;
    assert_eq!(output.outcome, Outcome::Error);
    assert!(output.content.contains("binary file"), "{}", output.content);
}

#[tokio::test]
async fn invalid_utf8_is_made_safe() {
    let fixture = Fixture::new();
    std::fs::write(fixture.root.join("latin1.txt"), b"caf\xe9\n").unwrap();
    let output = fixture.call("read_file", json!({"path": "latin1.txt"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert_eq!(
        output.content,
        "     1\tcaf\\xe9\n[keel: 1 byte shown as \\xNN escapes (not UTF-8 text or control bytes); the ledger keeps the exact bytes]\n"
    );
}

#[tokio::test]
async fn very_long_lines_are_truncated() {
    let fixture = Fixture::new();
    fixture.write("long.txt", &"x".repeat(5000));
    let output = fixture.call("read_file", json!({"path": "long.txt"})).await;
    assert!(output.content.contains("[line truncated]"));
    assert!(output.content.len() < 2100);
}

#[tokio::test]
async fn output_is_capped_for_huge_files() {
    let fixture = Fixture::new();
    let line = format!("{}\n", "y".repeat(1000));
    fixture.write("huge.txt", &line.repeat(1000));
    let output = fixture.call("read_file", json!({"path": "huge.txt"})).await;
    assert_eq!(output.outcome, Outcome::Ok);
    assert!(output.content.contains("[output capped at"), "{}", &output.content[..100]);
    assert!(output.content.len() < 300 * 1024);
}

#[tokio::test]
async fn errors_for_missing_folders_and_bad_arguments() {
    let fixture = Fixture::new();
    std::fs::create_dir(fixture.root.join("dir")).unwrap();
    for (arguments, expected) in [
        (json!({"path": "missing.txt"}), "cannot read `missing.txt`"),
        (json!({"path": "dir"}), "is a directory"),
        (json!({"path": ""}), "path is empty"),
        (json!({"path": "../x"}), "outside the workspace"),
        (json!({"path": "a", "offset": 0}), "at least 1"),
        (json!({"path": "a", "bogus": 1}), "invalid arguments for read_file"),
        (json!({}), "invalid arguments for read_file"),
    ] {
        let output = fixture.call("read_file", arguments.clone()).await;
        assert_eq!(output.outcome, Outcome::Error, "{arguments}");
        assert!(output.content.contains(expected), "{arguments}: {}", output.content);
    }
}
